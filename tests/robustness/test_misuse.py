"""Misuse fails with one clear line and never damages a build directory: two builds
into one directory, a directory from an older shard schema, a disk that fills up."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest

from pipeline.build.run import BuildConfig, BuildError, OutputLock, run_build
from tests.robustness.conftest import build_command, run_seam, seam_env, snapshot


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


@pytest.mark.slow
def test_a_second_build_into_a_directory_in_use_refuses_and_the_first_is_unharmed(
    reference, tmp_path
):
    first = subprocess.Popen(
        build_command(reference.corpus),
        cwd=tmp_path,
        env=seam_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (
        tmp_path / "out" / ".parts" / "fingerprint"
    ).exists():  # the first build holds the lock
        assert first.poll() is None and time.monotonic() < deadline, (
            first.stderr.read() if first.stderr else ""
        )
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGSTOP)  # hold it there, lock taken, work half done
    try:
        second = run_seam(build_command(reference.corpus), tmp_path)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode == 2
    assert "is in use by another seam build" in _one_line(second.stderr)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert snapshot(tmp_path / "out") == reference.files


def test_the_lock_admits_one_holder_at_a_time_while_holders_come_and_go(tmp_path):
    """Each holder unlinks the lock file as it leaves; one that opened the old file just
    before must not think it holds the lock while another locks the new file."""
    inside, overlaps, entries = [0], [0], [0]
    guard = threading.Lock()

    def contend():
        for _ in range(400):
            try:
                with OutputLock(tmp_path):
                    with guard:
                        inside[0] += 1
                        entries[0] += 1
                        overlaps[0] += inside[0] > 1
                    time.sleep(0)
                    with guard:
                        inside[0] -= 1
            except BuildError:
                pass

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert entries[0] > 0 and overlaps[0] == 0
    assert not (tmp_path / ".lock").exists()


def test_an_older_shard_schema_is_refused_with_the_command_that_rebuilds_it(reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference.out, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "shard_schema_version": "0.1"}))
    config = BuildConfig(
        [str(reference.corpus)],
        str(out),
        chunk_bytes=manifest["config"]["chunk_bytes"],
        rows_per_shard=manifest["config"]["rows_per_shard"],
        workers=1,
        progress=False,
    )
    with pytest.raises(BuildError) as error:
        run_build(config)
    message = str(error.value)
    assert "\n" not in message and "shard schema 0.1" in message
    assert message.endswith(f"rebuild it: {manifest['command']} --overwrite")
    rebuild = shlex.split(message.split("rebuild it: ", 1)[1])
    assert rebuild[:2] == ["seam", "build-rl"] and "--overwrite" in rebuild
    config.overwrite = True
    run_build(config)
    for shard in manifest["shards"]:
        assert (out / shard).read_bytes() == reference.files[shard]


def test_a_damaged_manifest_is_refused_in_one_line(reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference.out, out)
    (out / "manifest.json").write_text('{"shard_schema_version": ')
    with pytest.raises(BuildError, match="is not a seam manifest; choose another --out"):
        run_build(BuildConfig([str(reference.corpus)], str(out), workers=1, progress=False))


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


# tmpfs sizes as fractions of the finished build's bytes: up to ~1.25 the disk fills while
# tasks write their parts, at 1.5-2 while shards are written (parts and shards coexist).
FULL_AT = (
    [1.5] if not os.environ.get("SEAM_FUZZ_EXAMPLES") else [0.25, 0.75, 1.25, 1.5, 1.75, 2.0, 2.5]
)


@pytest.mark.slow
@pytest.mark.skipif(
    not _can_mount_tmpfs(), reason="needs unshare and a private tmpfs mount (Linux user namespaces)"
)
@pytest.mark.parametrize("fraction", FULL_AT)
def test_a_full_disk_fails_in_one_line_leaves_no_partial_shard_and_the_rerun_completes(
    reference, tmp_path, fraction
):
    """--out is a real tmpfs of a fraction of the finished build's size (in a private
    mount namespace), so the kernel answers ENOSPC mid-write; then it grows and the same
    command is run again."""
    size = max(16, int(sum(map(len, reference.files.values())) * fraction) // 4096) * 4096
    command = " ".join(shlex.quote(a) for a in build_command(reference.corpus))
    (tmp_path / "out").mkdir()
    script = (
        f"mount -t tmpfs -o size={size} tmpfs out || exit 99\n"
        f"{command} > stdout1 2> stderr1; echo $? > rc1; cp -a out full\n"
        f"mount -o remount,size=1g out\n"
        f"{command} > stdout2 2> stderr2; echo $? > rc2; cp -a out after\n"
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=tmp_path, env=seam_env(), timeout=900
    )
    assert done.returncode == 0

    def read(name: str) -> str:
        return (tmp_path / name).read_text()

    if read("rc1").strip() == "0":  # it fitted after all: nothing to check but the bytes
        assert snapshot(tmp_path / "full") == reference.files
        return
    assert read("rc1").strip() == "2"
    assert "No space left on device" in _one_line(read("stderr1")) and "rerun" in read("stderr1")
    full = tmp_path / "full"
    assert not [p for p in full.rglob(".*tmp*")]  # no temporary file left behind
    assert not (full / "manifest.json").exists()
    for shard in full.glob("train-*.parquet"):  # a shard that is visible is whole
        assert (
            pq.read_metadata(shard).num_rows > 0
            and shard.read_bytes() == reference.files[shard.name]
        )
    assert read("rc2").strip() == "0", read("stderr2")
    assert snapshot(tmp_path / "after") == reference.files
