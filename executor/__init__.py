"""The executor: RQ jobs that run task sessions in sandboxes against a model endpoint."""
