"""The sandbox's kernel class: IPython's, reporting the telemetry probe's reading with every execute_reply.

When the executor has installed its probe (the ``_pbe_probe`` module, see ``executor/probe.py``), each
``execute_reply`` carries ``metadata["pbe_probe"]``: the sandbox's cumulative CPU seconds and its peak memory
since the previous reply. Reading it here costs no extra request and no output formatting, and it is read
after failed cells too. Without the probe installed the kernel is IPython's, unchanged.
"""

import sys

from ipykernel.ipkernel import IPythonKernel

PROBE_MODULE = "_pbe_probe"


class ProbeKernel(IPythonKernel):
    def finish_metadata(self, parent, metadata, reply_content):  # type: ignore[no-untyped-def]
        metadata = super().finish_metadata(parent, metadata, reply_content)  # type: ignore[no-untyped-call]
        probe = sys.modules.get(PROBE_MODULE)
        if probe is not None:
            try:
                metadata["pbe_probe"] = probe.snapshot()
            except Exception as exc:  # the cell's code may have broken the probe: report, never fail the reply
                metadata["pbe_probe_error"] = repr(exc)
        return metadata
