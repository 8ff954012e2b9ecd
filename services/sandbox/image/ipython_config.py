"""IPython settings baked into the sandbox image (read by every kernel from /etc/ipython).

No history database: a sandbox lives for one session, and a kernel whose home is full (hostile or careless
code) would otherwise print sqlite warnings into the output of the cells that follow.
"""

c = get_config()  # type: ignore[name-defined]  # noqa: F821
c.HistoryManager.enabled = False
