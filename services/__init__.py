"""The contract every pybench-eval process shares.

The gateway, the executor and the grader never import each other; they meet through what is defined here.

At this level, the contract itself: the schemas (``evaluation``, ``task``, ``trajectory``, ``verdict``), the
settings base (``settings``), the queue names, job paths and payloads (``queues``), the task states in Redis
(``state``) and their one writer (``lifecycle``), the artifact store's layout (``store``), and the error tree
(``errors``). Grouped in subpackages, by what they speak: ``sandbox`` (every container and pod), ``endpoint``
(model endpoints), ``pybench`` (the benchmark's rules), ``results`` (scores, statistics, manifests), ``live``
(the rest of the live state in Redis) and ``observability`` (metrics, logs, health checks).
"""
