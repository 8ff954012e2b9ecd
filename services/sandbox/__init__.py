"""Sandboxes: the one place that creates, starts, execs in and removes containers and pods.

- ``contract``: the names, labels, limits and handle every sandbox shares (the image's user, the workspace).
- ``base``: the sandbox interface (``SandboxBackend``; a ``SandboxSpec`` says its purpose, a session or a grading)
  and the tar toolkit its backends share; ``registry`` picks a backend by name; ``docker``, ``kubernetes`` and
  ``local`` are the backends.
- ``runtime_volumes``: the image's ``/opt/venv`` and ``/usr`` as read-only volumes where the engine's storage
  driver is FUSE; ``docker_errors``: the engine's errors as one tuple.
- ``k8s_client`` and ``k8s_pods``: the Kubernetes client code and the hardened pod manifest.
- ``grading``: a grading as one use of a backend (start a grading sandbox, put the checker and the files in,
  ``exec`` the checker, read its answer, stop), the same on every backend; ``grading_backends`` picks the backend
  by ``PBE_GRADING_BACKEND`` (Docker or Kubernetes); ``grading_docker`` is the Docker one's shorthand for tests and
  benchmarks.
- ``image/``: the sandbox image the backends run.

Each backend imports its SDK (``docker``, ``kubernetes``) only when it is chosen.
"""
