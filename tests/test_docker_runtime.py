"""The image's /opt/venv and /usr served from read-only volumes: one set of copies per image however many workers
ask at once, the image's files in them, read-only in the container, and copies of removed images (or of another set
of folders) removed. Real engine, small images
made here (a tar of a few files, imported: no shell, no registry)."""

import contextlib
import io
import secrets
import tarfile
import threading
from collections.abc import Iterator
from typing import Any

import docker.client
import docker.errors
import pytest
from docker.types import Mount

from services.sandbox.contract import (
    PROJECT,
    PROJECT_LABEL,
    ROLE_LABEL,
    RUNTIME_COPY_ROLE,
    RUNTIME_FILLER_ROLE,
    RUNTIME_MARKER_ROLE,
)
from services.sandbox.runtime_volumes import (
    COPY_LABEL,
    FUSE_DRIVERS,
    IMAGE_LABEL,
    LAYOUT,
    LAYOUT_LABEL,
    RUNTIME_PATHS,
    RuntimeVolumes,
    copy_names,
    marker_name,
)

pytestmark = pytest.mark.docker


def _import_image(client: Any, stamp: str) -> str:
    """An image of two files under /opt/venv and one under /usr, tagged for this test; returns its id."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        files = (("opt/venv/stamp", stamp.encode()), ("opt/venv/lib/module.py", b"VALUE = 1\n"))
        files += (("usr/lib/os.py", b"X"),)
        for name, content in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    tag = f"pbe-test-runtime-{stamp}"
    client.api.import_image_from_data(data.getvalue(), repository=tag, tag="latest")
    return str(client.images.get(f"{tag}:latest").id)


def _volumes_of(client: Any, image_id: str) -> list[Any]:
    return list(client.volumes.list(filters={"label": [f"{IMAGE_LABEL}={image_id}"]}))


def _read(client: Any, image_id: str, mounts: list[Any], path: str) -> bytes:
    """A file as a container of ``image_id`` with ``mounts`` sees it (created, never started)."""
    container = client.api.create_container(
        image_id, command=["none"], host_config=client.api.create_host_config(mounts=mounts, network_mode="none")
    )
    try:
        stream, _ = client.api.get_archive(container["Id"], path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            assert member is not None
            return member.read()
    finally:
        client.api.remove_container(container["Id"], force=True)


@pytest.fixture()
def client() -> Iterator[Any]:
    engine = docker.client.from_env()
    yield engine
    engine.close()


@pytest.fixture()
def image(client: Any) -> Iterator[str]:
    image_id = _import_image(client, secrets.token_hex(4))
    yield image_id
    for volume in _volumes_of(client, image_id):
        volume.remove(force=True)
    client.images.remove(image_id, force=True)


def test_workers_asking_at_once_share_one_copy_of_the_images_files(client: Any, image: str) -> None:
    workers = [RuntimeVolumes(client, "on") for _ in range(3)]
    found: list[dict[str, str]] = []
    threads = [threading.Thread(target=lambda w=worker: found.append(w.copies_for(image))) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(found) == 3 and all(copies == found[0] for copies in found)  # every worker uses the published set
    assert sorted(found[0]) == sorted(RUNTIME_PATHS)
    copies = [v for v in _volumes_of(client, image) if v.attrs["Labels"][ROLE_LABEL] == RUNTIME_COPY_ROLE]
    assert sorted(v.name for v in copies) == sorted(found[0].values())  # the losers removed theirs
    marker = client.volumes.get(marker_name(image))
    assert copy_names(marker.attrs["Labels"][COPY_LABEL]) == found[0]
    # A worker that starts later finds them, and remembers them.
    source, mounts = RuntimeVolumes(client, "on").mounts(image)
    assert source == image and len(mounts) == len(RUNTIME_PATHS)
    assert {m["Target"]: m["Source"] for m in mounts} == found[0]
    assert all(m["ReadOnly"] is True and m["VolumeOptions"]["NoCopy"] is True for m in mounts)
    stamp = client.images.get(image).tags[0].split("pbe-test-runtime-")[1].split(":")[0]
    assert _read(client, image, mounts, "/opt/venv/stamp") == stamp.encode()
    assert _read(client, image, mounts, "/opt/venv/lib/module.py") == b"VALUE = 1\n"
    assert _read(client, image, mounts, "/usr/lib/os.py") == b"X"


def test_the_copy_is_read_only_in_the_container(client: Any, image: str) -> None:
    _, mounts = RuntimeVolumes(client, "on").mounts(image)
    container = client.api.create_container(
        image, command=["none"], host_config=client.api.create_host_config(mounts=mounts, network_mode="none")
    )
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.addfile(tarfile.TarInfo("planted"), io.BytesIO(b""))
        for path in RUNTIME_PATHS:
            with pytest.raises(docker.errors.APIError, match="read-only"):
                client.api.put_archive(container["Id"], path, archive.getvalue())
    finally:
        client.api.remove_container(container["Id"], force=True)


def test_off_mounts_nothing_and_auto_follows_the_storage_driver(client: Any, image: str) -> None:
    assert RuntimeVolumes(client, "off").mounts(image) == (image, [])
    assert RuntimeVolumes(client, "auto").enabled() is (client.info()["Driver"] in FUSE_DRIVERS)
    assert _volumes_of(client, image) == []  # off made nothing


def test_a_missing_image_is_said_to_be_missing(client: Any) -> None:
    with pytest.raises(docker.errors.ImageNotFound):
        RuntimeVolumes(client, "on").mounts("pbe-test-runtime-never-built:latest")


def test_copies_of_removed_images_go_when_a_new_copy_is_made(client: Any, image: str) -> None:
    old = _import_image(client, secrets.token_hex(4))
    RuntimeVolumes(client, "on").copies_for(old)
    assert len(_volumes_of(client, old)) == len(RUNTIME_PATHS) + 1  # the copies and their marker
    client.images.remove(old, force=True)
    RuntimeVolumes(client, "on").copies_for(image)
    assert _volumes_of(client, old) == []
    assert len(_volumes_of(client, image)) == len(RUNTIME_PATHS) + 1


def test_copies_of_another_set_of_folders_are_replaced(client: Any, image: str) -> None:
    """An earlier version's copy (one volume of /opt/venv, a marker without the layout) is neither mounted nor kept."""
    labels = {PROJECT_LABEL: PROJECT, IMAGE_LABEL: image}
    legacy = f"{marker_name(image)}-legacy"
    client.volumes.create(legacy, labels={**labels, ROLE_LABEL: RUNTIME_COPY_ROLE})
    client.volumes.create(marker_name(image), labels={**labels, ROLE_LABEL: RUNTIME_MARKER_ROLE, COPY_LABEL: legacy})
    copies = RuntimeVolumes(client, "on").copies_for(image)
    assert legacy not in copies.values() and sorted(copies) == sorted(RUNTIME_PATHS)
    names = {v.name: v.attrs["Labels"] for v in _volumes_of(client, image)}
    assert legacy not in names and all(labels[LAYOUT_LABEL] == LAYOUT for labels in names.values())


def test_a_copy_removed_by_hand_is_made_again(client: Any, image: str) -> None:
    first = RuntimeVolumes(client, "on").copies_for(image)
    client.volumes.get(first["/usr"]).remove(force=True)  # the marker stays, naming a volume that is gone
    second = RuntimeVolumes(client, "on").copies_for(image)
    assert set(second.values()).isdisjoint(first.values())
    assert all(client.volumes.get(name).name == name for name in second.values())
    assert copy_names(client.volumes.get(marker_name(image)).attrs["Labels"][COPY_LABEL]) == second
    # The first set's remaining copy is removed with it: one set per image on disk.
    assert sorted(v.name for v in _volumes_of(client, image)) == sorted([*second.values(), marker_name(image)])


def test_a_copy_that_cannot_be_made_leaves_nothing(client: Any) -> None:
    gone = "sha256:" + "0" * 64  # no such image: the copy's filler cannot be created
    with pytest.raises(docker.errors.DockerException):
        RuntimeVolumes(client, "on").copies_for(gone)
    assert _volumes_of(client, gone) == []


def test_a_filler_left_by_a_worker_killed_as_it_made_copies_goes_with_its_copies(client: Any, image: str) -> None:
    """A worker killed while the engine filled its copies leaves them and their filler (created, never started,
    holding them); the next worker to serve the image removes both and serves the published copies."""
    published = RuntimeVolumes(client, "on").copies_for(image)
    labels = {PROJECT_LABEL: PROJECT, IMAGE_LABEL: image, LAYOUT_LABEL: LAYOUT}
    left = copy_names(f"{marker_name(image)}-killed")
    for volume in left.values():
        client.volumes.create(volume, labels={**labels, ROLE_LABEL: RUNTIME_COPY_ROLE})
    mounts = [Mount(path, volume, type="volume") for path, volume in left.items()]
    filler = client.api.create_container(
        image,
        entrypoint=["true"],
        host_config=client.api.create_host_config(mounts=mounts, network_mode="none"),
        labels={**labels, ROLE_LABEL: RUNTIME_FILLER_ROLE, COPY_LABEL: f"{marker_name(image)}-killed"},
    )["Id"]
    try:
        assert RuntimeVolumes(client, "on").copies_for(image) == published
        assert client.containers.list(all=True, filters={"id": filler}) == []
        names = {volume.name for volume in _volumes_of(client, image)}
        assert not set(left.values()) & names and set(published.values()) <= names
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(filler, force=True)
