"""What a call to the Docker engine can raise: the SDK's own errors and the HTTP client's under it (a refused or
broken connection to the engine's socket)."""

import docker.errors
import requests

DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)
"""Catch these around an engine call; anything else is a bug of ours."""
