"""What operators see: Prometheus series (``monitoring``), log lines (``logs``) and the containers' health checks
(``health``, standard library only: run by path as a container's check)."""
