#!/bin/sh
# Start the sandbox's kernel gateway. The root filesystem may be read-only: what must be writable lives in
# /tmp, /home/sandbox and /workspace (size-capped mounts given by the backend).
set -e
mkdir -p /tmp/jupyter-runtime /workspace/data /workspace/output
cp -r /opt/matplotlib /tmp/matplotlib 2>/dev/null || true
# jupyter-kernelgateway, not `jupyter kernelgateway`: the latter starts a Python only to find and exec this one.
exec jupyter-kernelgateway --config=/etc/jupyter/jupyter_kernel_gateway_config.py
