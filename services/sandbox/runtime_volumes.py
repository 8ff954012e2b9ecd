"""The sandbox image's software (``/opt/venv`` and ``/usr``) served to its containers from read-only volumes.

On an engine whose storage driver is fuse-overlayfs (rootless Docker, Docker inside a container, this project's CI
machines), every file a container opens, and every one Python looks for and does not find as it imports, goes
through a FUSE daemon of the container's own: the kernel gateway and the kernel import about 1,500 modules (the
scientific stack's from ``/opt/venv``, the standard library's from ``/usr``), so a sandbox's start cost that daemon
about half a CPU-second. A volume is a plain bind mount, read by the kernel directly. So, once per image, the
engine copies the image's ``/opt/venv`` and ``/usr`` into volumes of their own (it does so itself when a container
mounts an empty volume there), and sandboxes and grading sandboxes mount them read-only over those folders, with the
same files, owners and modes as the image's. Nothing a sandbox can write is shared: the mounts are read-only, like
the root filesystem they shadow.

Two workers may make the copies for one image at once; the first to publish wins: each fills volumes of a stem of
its own, then creates the image's marker volume (``pbe-runtime-<image>``) labelled with that stem. The engine makes
one volume of a name and answers a second creation with the first, so every worker reads the same winner from the
marker's label, and a loser removes its own copies. When new copies are published, the others are removed: those
of images the engine no longer has, those made for another set of folders (an earlier version), and earlier sets of
the same image whose marker was replaced (a volume still mounted is left to the next time). An image's copies take
about as much disk as its ``/opt/venv`` and ``/usr`` (about 2 GB for the sandbox image).

``PBE_SANDBOX_RUNTIME_VOLUME``: ``auto`` (on where the storage driver is FUSE, the default), ``on`` or ``off``.
"""

import contextlib
import logging
import secrets
import threading
from typing import Any

import docker.errors
from docker.types import Mount

from services.sandbox.contract import (
    PROJECT,
    PROJECT_LABEL,
    ROLE_LABEL,
    RUNTIME_COPY_ROLE,
    RUNTIME_FILLER_ROLE,
    RUNTIME_MARKER_ROLE,
    RuntimeVolumeMode,
)
from services.sandbox.docker_errors import DOCKER_ERRORS

log = logging.getLogger(__name__)

RUNTIME_PATHS: tuple[str, ...] = ("/opt/venv", "/usr")
"""The image's folders served from volumes: its Python environment (the kernel gateway, the kernel and the
scientific stack) and its system (the interpreter, the standard library, shared libraries, ffmpeg, fonts)."""
LAYOUT = ",".join(RUNTIME_PATHS)
"""What a set of copies holds: copies made for other folders are stale."""

FUSE_DRIVERS = frozenset({"fuse-overlayfs"})
"""Storage drivers whose reads go through a daemon: where ``auto`` turns the volume on."""

IMAGE_LABEL = "pybench-eval.image"
"""On a copy and its marker: the image id the copy was made from."""
COPY_LABEL = "pybench-eval.runtime-copy"
"""On a marker: the stem of the names of the volumes that hold the image's copies (``copy_names``)."""
LAYOUT_LABEL = "pybench-eval.runtime-paths"
"""On copies and markers: the folders the copies were made of (``LAYOUT``)."""


def marker_name(image_id: str) -> str:
    """The marker volume of the image ``image_id`` (``sha256:...``)."""
    return f"pbe-runtime-{image_id.split(':')[-1][:24]}"


def copy_names(stem: str) -> dict[str, str]:
    """The volume that holds each of ``RUNTIME_PATHS`` in the set of copies named ``stem``."""
    return {path: stem + path.replace("/", "-") for path in RUNTIME_PATHS}


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
                with contextlib.suppress(*DOCKER_ERRORS):
                    driver = str(self.client.info().get("Driver", ""))
                self._enabled = driver in FUSE_DRIVERS
            else:
                self._enabled = self.mode == "on"
        return self._enabled

    def mounts(self, image: str) -> tuple[str, list[Mount]]:
        """What to create a container of ``image`` from, and the mounts that serve its software from volumes.

        Returns:
            The image's id and the read-only mounts of its copies when the volumes are on (the container is then
            created from that id, so its files and the copies' are of one build), else ``image`` as given and no
            mount. Copies that cannot be made are logged and the container reads the image's own files.

        Raises:
            docker.errors.ImageNotFound: the image is missing (the caller says to build it).
        """
        if not self.enabled():
            return image, []
        image_id = str(self.client.images.get(image).id)
        try:
            copies = self.copies_for(image_id)
        except DOCKER_ERRORS as exc:
            log.warning("cannot serve %s's %s from volumes, reading the image's own: %s", image, LAYOUT, exc)
            return image, []
        return image_id, [
            Mount(path, volume, type="volume", read_only=True, no_copy=True) for path, volume in copies.items()
        ]

    def copies_for(self, image_id: str) -> dict[str, str]:
        """The volume that holds each of ``image_id``'s ``RUNTIME_PATHS``, made when there are none (seconds).

        Raises:
            docker.errors.DockerException, requests.RequestException: the engine failed.
        """
        with self._lock:  # one copy at a time in this process: the others wait for it, then use it
            if image_id not in self._copies:
                stem = self._published(image_id)
                if stem is None:
                    stem = self._publish(image_id)
                else:  # what a worker killed while it made copies left (once a process)
                    self._remove_stale(image_id, stem)
                self._copies[image_id] = stem
            return copy_names(self._copies[image_id])

    def _published(self, image_id: str) -> str | None:
        try:
            marker = self.client.volumes.get(marker_name(image_id))
        except docker.errors.NotFound:
            return None
        labels = marker.attrs.get("Labels") or {}
        stem = labels.get(COPY_LABEL)
        if stem and labels.get(LAYOUT_LABEL) == LAYOUT:
            try:
                for volume in copy_names(stem).values():
                    self.client.volumes.get(volume)
                return str(stem)
            except docker.errors.NotFound:  # removed by hand: mounting it would make an empty one
                log.warning("a runtime copy %s* of image %s is gone: making them again", stem, image_id)
        with contextlib.suppress(*DOCKER_ERRORS):
            self.client.api.remove_volume(marker.name)
        return None

    def _publish(self, image_id: str) -> str:
        labels = {PROJECT_LABEL: PROJECT, IMAGE_LABEL: image_id, LAYOUT_LABEL: LAYOUT}
        stem = f"{marker_name(image_id)}-{secrets.token_hex(4)}"
        copies = copy_names(stem)
        try:
            for volume in copies.values():
                self.client.volumes.create(volume, driver="local", labels={**labels, ROLE_LABEL: RUNTIME_COPY_ROLE})
            # The engine copies the image's files into an empty volume when a container that mounts it is created.
            filler = self.client.api.create_container(
                image_id,
                entrypoint=["true"],
                network_disabled=True,
                host_config=self.client.api.create_host_config(
                    mounts=[Mount(path, volume, type="volume") for path, volume in copies.items()], network_mode="none"
                ),
                labels={**labels, ROLE_LABEL: RUNTIME_FILLER_ROLE, COPY_LABEL: stem},
            )
            with contextlib.suppress(docker.errors.NotFound):  # another worker took it for a killed one's
                self.client.api.remove_container(filler["Id"], force=True)
        except BaseException:  # copies cut short (a full disk) are never published: remove them
            self._remove_copies(stem)
            raise
        marker = self.client.volumes.create(
            marker_name(image_id), driver="local", labels={**labels, ROLE_LABEL: RUNTIME_MARKER_ROLE, COPY_LABEL: stem}
        )
        winner = str((marker.attrs.get("Labels") or {}).get(COPY_LABEL) or stem)
        if winner != stem:  # another worker published first: its copies serve everyone
            self._remove_copies(stem)
        else:
            log.info("serving %s of image %s from volumes %s*", LAYOUT, image_id, stem)
            self._remove_stale(image_id, stem)
        return winner

    def _remove_copies(self, stem: str) -> None:
        for volume in copy_names(stem).values():
            with contextlib.suppress(*DOCKER_ERRORS):
                self.client.api.remove_volume(volume, force=True)

    def _remove_stale(self, current: str, stem: str) -> None:
        """Remove the fillers (never started) but ``stem``'s, then the copies (markers first) of images the engine no
        longer has, copies of another layout, and the copies of ``current`` but those of ``stem`` (sets whose marker
        was replaced, and those of a worker killed as it made them); one still mounted stays. Never raises: what
        cannot be removed now is removed the next time."""
        try:
            self._remove_fillers(stem)
            self._remove_stale_volumes(current, stem)
        except DOCKER_ERRORS as exc:
            log.warning("stale runtime copies not removed this time: %s", exc)

    def _remove_fillers(self, stem: str) -> None:
        """Containers that filled copies (those of earlier versions carry no role, only the image label) but
        ``stem``'s: a worker killed while the engine made its copies leaves one, created, holding them."""
        for container in self.client.api.containers(
            all=True, filters={"label": [f"{PROJECT_LABEL}={PROJECT}", IMAGE_LABEL]}
        ):
            labels = container.get("Labels") or {}
            if labels.get(ROLE_LABEL) in (None, RUNTIME_FILLER_ROLE) and labels.get(COPY_LABEL) != stem:
                with contextlib.suppress(*DOCKER_ERRORS):
                    self.client.api.remove_container(container["Id"], force=True)

    def _remove_stale_volumes(self, current: str, stem: str) -> None:
        published = set(copy_names(stem).values())
        roles = (RUNTIME_MARKER_ROLE, RUNTIME_COPY_ROLE)
        for role in roles:
            for volume in self.client.volumes.list(filters={"label": [f"{ROLE_LABEL}={role}"]}):
                labels = volume.attrs.get("Labels") or {}
                image_id = labels.get(IMAGE_LABEL, "")
                if labels.get(LAYOUT_LABEL) != LAYOUT:
                    stale = True
                elif image_id == current:
                    stale = role == RUNTIME_COPY_ROLE and volume.name not in published
                else:
                    stale = not self._image_exists(image_id)
                if stale:
                    with contextlib.suppress(*DOCKER_ERRORS):
                        self.client.api.remove_volume(volume.name)

    def _image_exists(self, image_id: str) -> bool:
        if not image_id:
            return False
        try:
            self.client.images.get(image_id)
        except docker.errors.ImageNotFound:
            return False
        except DOCKER_ERRORS:
            return True  # unsure: keep it
        return True
