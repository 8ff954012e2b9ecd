"""The sandbox image's Python environment (``/opt/venv``) served to its containers from a read-only volume.

On an engine whose storage driver is fuse-overlayfs (rootless Docker, Docker inside a container, this project's CI
machines), every file a container opens, and every one Python looks for and does not find as it imports, goes
through a FUSE daemon of the container's own: the kernel gateway and the kernel import about 1,500 modules, so a
sandbox's start cost that daemon about 0.4 CPU-seconds. A volume is a plain bind mount, read by the kernel directly.
So, once per image, the engine copies the image's ``/opt/venv`` into a volume (it does so itself when a container
mounts an empty volume there), and sandboxes and grading sandboxes mount that volume read-only over it, with the
same files, owners and modes as the image's. Nothing a sandbox can write is shared: the mount is read-only, like
the root filesystem it shadows.

Two workers may make the copy for one image at once; the first to publish it wins: each fills a volume of a name of
its own, then creates the image's marker volume (``pbe-runtime-<image>``) labelled with that name. The engine makes
one volume of a name and answers a second creation with the first, so every worker reads the same winner from the
marker's label, and a loser removes its own copy. The copies of images the engine no longer has are removed when a
new copy is made (a volume still mounted is left to the next time).

``PBE_SANDBOX_RUNTIME_VOLUME``: ``auto`` (on where the storage driver is FUSE, the default), ``on`` or ``off``.
"""

import contextlib
import logging
import secrets
import threading
from typing import Any

import docker.errors
import requests
from docker.types import Mount

from services.sandbox import (
    PROJECT,
    PROJECT_LABEL,
    ROLE_LABEL,
    RUNTIME_COPY_ROLE,
    RUNTIME_MARKER_ROLE,
    RuntimeVolumeMode,
)

log = logging.getLogger(__name__)

RUNTIME_PATH = "/opt/venv"
"""The sandbox image's Python environment: the kernel gateway, the kernel and the scientific stack."""

FUSE_DRIVERS = frozenset({"fuse-overlayfs"})
"""Storage drivers whose reads go through a daemon: where ``auto`` turns the volume on."""

IMAGE_LABEL = "pybench-eval.image"
"""On a copy and its marker: the image id the copy was made from."""
COPY_LABEL = "pybench-eval.runtime-copy"
"""On a marker: the name of the volume that holds the image's copy."""
_DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)


def marker_name(image_id: str) -> str:
    """The marker volume of the image ``image_id`` (``sha256:...``)."""
    return f"pbe-runtime-{image_id.split(':')[-1][:24]}"


class RuntimeVolumes:
    """The runtime copies one process uses, by image id (made or found once, then remembered).

    Args:
        client: a ``docker.DockerClient``.
        mode: ``auto``, ``on`` or ``off`` (module docstring).
    """

    def __init__(self, client: Any, mode: RuntimeVolumeMode = "auto") -> None:
        self.client = client
        self.mode = mode
        self._lock = threading.Lock()
        self._enabled: bool | None = None
        self._copies: dict[str, str] = {}

    def enabled(self) -> bool:
        """Whether containers get the volume: ``on``, or ``auto`` on a FUSE storage driver (asked once)."""
        if self._enabled is None:
            if self.mode == "auto":
                driver = ""
                with contextlib.suppress(*_DOCKER_ERRORS):
                    driver = str(self.client.info().get("Driver", ""))
                self._enabled = driver in FUSE_DRIVERS
            else:
                self._enabled = self.mode == "on"
        return self._enabled

    def mounts(self, image: str) -> tuple[str, list[Mount]]:
        """What to create a container of ``image`` from, and the mounts that serve its runtime from a volume.

        Returns:
            The image's id and the read-only mount of its copy when the volume is on (the container is then created
            from that id, so its files and the copy's are of one build), else ``image`` as given and no mount. A
            copy that cannot be made is logged and the container reads the image's own files.

        Raises:
            docker.errors.ImageNotFound: the image is missing (the caller says to build it).
        """
        if not self.enabled():
            return image, []
        image_id = str(self.client.images.get(image).id)
        try:
            copy = self.copy_for(image_id)
        except _DOCKER_ERRORS as exc:
            log.warning("cannot serve %s's %s from a volume, reading the image's own: %s", image, RUNTIME_PATH, exc)
            return image, []
        return image_id, [Mount(RUNTIME_PATH, copy, type="volume", read_only=True, no_copy=True)]

    def copy_for(self, image_id: str) -> str:
        """The volume that holds ``image_id``'s ``/opt/venv``, made when there is none (seconds: a full copy).

        Raises:
            docker.errors.DockerException, requests.RequestException: the engine failed.
        """
        with self._lock:  # one copy at a time in this process: the others wait for it, then use it
            if image_id not in self._copies:
                self._copies[image_id] = self._published(image_id) or self._publish(image_id)
            return self._copies[image_id]

    def _published(self, image_id: str) -> str | None:
        try:
            marker = self.client.volumes.get(marker_name(image_id))
        except docker.errors.NotFound:
            return None
        copy = (marker.attrs.get("Labels") or {}).get(COPY_LABEL)
        if copy:
            try:
                self.client.volumes.get(copy)
                return str(copy)
            except docker.errors.NotFound:  # removed by hand: mounting it would make an empty one
                log.warning("the runtime copy %s of image %s is gone: making it again", copy, image_id)
        with contextlib.suppress(*_DOCKER_ERRORS):
            self.client.api.remove_volume(marker.name)
        return None

    def _publish(self, image_id: str) -> str:
        labels = {PROJECT_LABEL: PROJECT, IMAGE_LABEL: image_id}
        copy = f"{marker_name(image_id)}-{secrets.token_hex(4)}"
        self.client.volumes.create(copy, driver="local", labels={**labels, ROLE_LABEL: RUNTIME_COPY_ROLE})
        # The engine copies the image's files into an empty volume when a container that mounts it is created.
        try:
            filler = self.client.api.create_container(
                image_id,
                entrypoint=["true"],
                network_disabled=True,
                host_config=self.client.api.create_host_config(
                    mounts=[Mount(RUNTIME_PATH, copy, type="volume")], network_mode="none"
                ),
                labels=labels,
            )
            self.client.api.remove_container(filler["Id"], force=True)
        except BaseException:  # a copy cut short (a full disk) is never published: remove it
            with contextlib.suppress(*_DOCKER_ERRORS):
                self.client.api.remove_volume(copy, force=True)
            raise
        marker = self.client.volumes.create(
            marker_name(image_id), driver="local", labels={**labels, ROLE_LABEL: RUNTIME_MARKER_ROLE, COPY_LABEL: copy}
        )
        winner = str((marker.attrs.get("Labels") or {}).get(COPY_LABEL) or copy)
        if winner != copy:  # another worker published first: its copy serves everyone
            with contextlib.suppress(*_DOCKER_ERRORS):
                self.client.api.remove_volume(copy, force=True)
        else:
            log.info("serving %s of image %s from volume %s", RUNTIME_PATH, image_id, copy)
            self._remove_stale(image_id)
        return winner

    def _remove_stale(self, current: str) -> None:
        """Remove the copies (markers first) of images the engine no longer has; one still mounted stays."""
        roles = (RUNTIME_MARKER_ROLE, RUNTIME_COPY_ROLE)
        for role in roles:
            for volume in self.client.volumes.list(filters={"label": [f"{ROLE_LABEL}={role}"]}):
                image_id = (volume.attrs.get("Labels") or {}).get(IMAGE_LABEL, "")
                if image_id == current or self._image_exists(image_id):
                    continue
                with contextlib.suppress(*_DOCKER_ERRORS):
                    self.client.api.remove_volume(volume.name)

    def _image_exists(self, image_id: str) -> bool:
        if not image_id:
            return False
        try:
            self.client.images.get(image_id)
        except docker.errors.ImageNotFound:
            return False
        except _DOCKER_ERRORS:
            return True  # unsure: keep it
        return True
