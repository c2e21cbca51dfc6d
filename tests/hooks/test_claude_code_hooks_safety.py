"""``seam hooks`` never clobbers what it did not write (issue 27, the hooks surface).

Each test is an attack that the first version of ``seam hooks install claude-code``
lost to: a symlinked settings file replaced by a regular file, a read-only or
differently-moded file rewritten as 0600, a user's hook deleted because its command
contained ``seam hooks capture claude-code``, ``1e400`` written back as ``Infinity``,
a traceback for a directory or an immutable file, a hook that ran a project's own
``pipeline/`` package when ``seam`` was not on PATH, and a capture whose session id
``..`` wrote above the capture folder.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.hooks import json_exact, settings_file
from pipeline.hooks.claude_code import (
    STATUS_MARK,
    capture_command,
    install,
    is_seam_entry,
    seam_program,
    uninstall,
)

ROOT = Path(__file__).resolve().parents[2]
SEAM = ["/opt/seam/bin/seam"]
PRE = ("PreCompact",)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def install_cli(
    capsys, settings: Path, *extra: str, capture: Path | None = None
) -> tuple[int, str, str]:
    return cli(
        capsys,
        "hooks",
        "install",
        "claude-code",
        "--settings",
        str(settings),
        "--capture",
        str(capture or settings.parent / "cap"),
        "--no-post-compact",
        *extra,
    )


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


def assert_one_line_refusal(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_a_symlinked_settings_file_stays_a_symlink_and_its_target_is_edited(tmp_path, capsys):
    home = tmp_path / "home"
    dotfiles = tmp_path / "dotfiles"
    (home / ".claude").mkdir(parents=True)
    dotfiles.mkdir()
    target = dotfiles / "claude-settings.json"
    target.write_text('{"model": "opus"}\n')
    target.chmod(0o640)
    link = home / ".claude" / "settings.json"
    link.symlink_to(target)
    code, _, err = install_cli(capsys, link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    data = json.loads(target.read_text())
    assert data["model"] == "opus" and is_seam_entry(data["hooks"]["PreCompact"][0]["hooks"][0])
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    leftovers = [p.name for d in (home / ".claude", dotfiles) for p in d.iterdir()]
    assert sorted(leftovers) == ["cap", "claude-settings.json", "settings.json"]


def test_a_symlink_to_nothing_is_refused(tmp_path, capsys):
    link = tmp_path / "settings.json"
    link.symlink_to(tmp_path / "missing" / "settings.json")
    assert_one_line_refusal(*install_cli(capsys, link)[::2], "does not exist")
    assert link.is_symlink() and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o660])
def test_the_file_mode_is_kept(tmp_path, mode):
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    settings.chmod(mode)
    install(settings, capture_command(tmp_path, SEAM), PRE)
    assert stat.S_IMODE(settings.stat().st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_root_editing_a_users_file_leaves_it_the_users(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    os.chown(settings, 1234, 1235)
    install(settings, capture_command(tmp_path, SEAM), PRE)
    assert (settings.stat().st_uid, settings.stat().st_gid) == (1234, 1235)


def test_a_read_only_file_is_refused_and_force_rewrites_it_keeping_0444(tmp_path, capsys):
    settings = tmp_path / "settings.json"
    settings.write_text('{"model": "opus"}')
    settings.chmod(0o444)
    before = snapshot(settings)
    code, _, err = install_cli(capsys, settings)
    assert_one_line_refusal(code, err, "read-only (mode 0444)", "--force")
    assert snapshot(settings) == before
    code, _, err = install_cli(capsys, settings, "--force")
    assert code == 0, err
    assert stat.S_IMODE(settings.stat().st_mode) == 0o444
    assert "PreCompact" in json.loads(settings.read_text())["hooks"]


def test_a_file_without_read_permission_is_refused(tmp_path, capsys):
    """As root the kernel would read a mode-0000 file; the mode says not to."""
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    settings.chmod(0o000)
    assert_one_line_refusal(*install_cli(capsys, settings)[::2], "not readable (mode 0000)")
    settings.chmod(0o600)
    assert settings.read_text() == "{}"


def test_a_directory_is_refused_even_with_force(tmp_path, capsys):
    folder = tmp_path / "settings.json"
    folder.mkdir()
    for extra in ((), ("--force",)):
        assert_one_line_refusal(*install_cli(capsys, folder, *extra)[::2], "is a directory")
    assert list(folder.iterdir()) == []


def test_a_capture_folder_that_is_a_file_is_refused_before_the_settings_change(tmp_path, capsys):
    settings, blocker = tmp_path / "settings.json", tmp_path / "notes"
    blocker.write_text("mine")
    code, _, err = install_cli(capsys, settings, capture=blocker / "cap")
    assert_one_line_refusal(code, err, "notes is not a directory")
    assert not settings.exists() and blocker.read_text() == "mine"


def test_an_immutable_file_is_refused_even_with_force(tmp_path, capsys):
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    if (
        shutil.which("chattr") is None
        or subprocess.run(["chattr", "+i", str(settings)], capture_output=True).returncode
    ):
        pytest.skip("chattr +i is not available here (needs root and ext4/xfs/btrfs)")
    try:
        for extra in ((), ("--force",)):
            assert_one_line_refusal(
                *install_cli(capsys, settings, *extra)[::2], "is immutable (lsattr"
            )
        assert settings.read_text() == "{}"
        assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # no cap/ either
    finally:
        subprocess.run(["chattr", "-i", str(settings)], check=True)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run seam without the DAC override capabilities",
)
def test_files_this_user_may_not_read_or_write_are_refused(tmp_path):
    """Without CAP_DAC_OVERRIDE (a non-root user, in effect) the kernel itself denies
    access to another user's 0600 file and write access to their 0644 file."""
    tmp_path.chmod(0o755)
    cases = {0o600: "not readable (mode 0600)", 0o644: "read-only (mode 0644)"}
    paths = []
    for mode in cases:
        settings = tmp_path / f"settings-{mode:o}.json"
        settings.write_text("{}")
        settings.chmod(mode)
        os.chown(settings, 1234, 1234)
        paths.append(str(settings))
    script = (
        "import sys; from pipeline.cli import main\n"
        "for path in sys.argv[1:]:\n"
        "    args = ['hooks', 'install', 'claude-code', '--settings', path, '--no-post-compact']\n"
        f"    print(main(args + ['--capture', {str(tmp_path / 'cap')!r}]))\n"
    )
    without_dac = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    run = subprocess.run(
        [*without_dac, sys.executable, "-c", script, *paths],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.stdout.split() == ["2", "2"], run.stderr
    for line, (path, words) in zip(run.stderr.splitlines(), zip(paths, cases.values())):
        assert_one_line_refusal(2, line + "\n", path, words)
        assert Path(path).read_text() == "{}"
    assert len(run.stderr.splitlines()) == 2, run.stderr


def test_a_user_hook_that_merely_mentions_the_capture_command_is_kept(tmp_path):
    settings = tmp_path / "settings.json"
    user_hooks = [
        {"type": "command", "command": "seam hooks capture claude-code --capture /x && notify"},
        {"type": "command", "command": "/usr/bin/seam hooks capture claude-code --capture /x"},
        {
            "type": "command",
            "command": "/usr/bin/seam hooks capture claude-code --capture /x",
            "timeout": 30,
        },
        {"type": "command", "command": "echo 'hooks capture claude-code'", "timeout": 60},
        # The shape of an earlier seam's entry, but not what it wrote: a bare `seam`, and
        # quoting that an earlier seam (shlex.quote) would not have produced.
        {
            "type": "command",
            "command": "seam hooks capture claude-code --capture /x",
            "timeout": 60,
        },
        {
            "type": "command",
            "command": "/usr/bin/seam hooks capture claude-code --capture '/x'",
            "timeout": 60,
        },
    ]
    empty = {"matcher": "manual", "hooks": []}  # the user's own, empty before seam came
    settings.write_text(json.dumps({"hooks": {"PreCompact": [{"hooks": user_hooks}, empty]}}))
    assert install(settings, capture_command(tmp_path / "cap", SEAM), PRE) == {
        "PreCompact": "added"
    }
    groups = json.loads(settings.read_text())["hooks"]["PreCompact"]
    assert groups[:2] == [{"hooks": user_hooks}, empty] and len(groups) == 3
    assert uninstall(settings) == {"PreCompact": "removed"}
    assert json.loads(settings.read_text())["hooks"]["PreCompact"] == [{"hooks": user_hooks}, empty]


def test_an_earlier_seams_exact_entries_are_upgraded_and_uninstalled(tmp_path):
    """What the first version wrote (no mark): the absolute seam script, or an absolute
    Python with ``-m pipeline.cli``; timeout 60 and no other key."""
    settings = tmp_path / "settings.json"
    old = [
        {
            "type": "command",
            "command": "/home/u/.local/bin/seam hooks capture claude-code --capture /home/u/cap",
            "timeout": 60,
        },
        {
            "type": "command",
            "command": "/usr/bin/python3 -m pipeline.cli hooks capture claude-code "
            "--capture '/home/u/my caps'",
            "timeout": 60,
        },
    ]
    other = {"type": "command", "command": "backup.sh"}
    settings.write_text(
        json.dumps({"hooks": {"PreCompact": [{"hooks": [old[0], other]}, {"hooks": [old[1]]}]}})
    )
    assert all(is_seam_entry(h) for h in old)
    command = capture_command(tmp_path / "cap", SEAM)
    assert install(settings, command, PRE) == {"PreCompact": "updated"}
    groups = json.loads(settings.read_text())["hooks"]["PreCompact"]
    assert groups == [
        {"hooks": [other]},
        {
            "hooks": [
                {"type": "command", "command": command, "timeout": 60, "statusMessage": STATUS_MARK}
            ]
        },
    ]
    assert uninstall(settings) == {"PreCompact": "removed"}
    assert json.loads(settings.read_text())["hooks"]["PreCompact"] == [{"hooks": [other]}]


def test_numbers_keep_their_text_and_the_file_stays_json(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text(
        '{"a": 1e400, "b": 1E5, "c": -0, "d": 12345678901234567890123, "e": 0.1, '
        '"f": [1.50, -2e-400], "s": "caf\\u00e9 \u2713"}'
    )
    install(settings, capture_command(tmp_path / "cap", SEAM), PRE)
    text = settings.read_text()
    for kept in ('"a": 1e400', '"b": 1E5', '"c": -0', "12345678901234567890123", "0.1", "1.50"):
        assert kept in text
    assert "-2e-400" in text and "Infinity" not in text

    def no_constants(name):
        raise AssertionError(f"{name} written")

    data = json.loads(text, parse_constant=no_constants)
    assert data["s"] == "café ✓" and data["hooks"]["PreCompact"][0]["hooks"][0]["timeout"] == 60


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": -Infinity}', "-Infinity is not a JSON value"),
        ('{"a": 1, "a": 2}', "'a' appears twice"),
        ('{"model": "opus",', "is not JSON"),
        ("[1, 2]", "does not hold a JSON object"),
    ],
)
def test_what_cannot_be_written_back_exactly_is_refused_untouched(tmp_path, capsys, text, words):
    settings = tmp_path / "settings.json"
    settings.write_text(text)
    assert_one_line_refusal(*install_cli(capsys, settings)[::2], words)
    assert settings.read_text() == text


def test_exact_json_round_trips_what_json_dumps_writes(tmp_path):
    value = {"a": [1, 2.5, {"b": None, "c": True}], "d": {}, "e": [], "f": "x\ny\u00e9"}
    text = json.dumps(value, indent=2, ensure_ascii=False)
    assert json_exact.dumps(json_exact.loads(text)) == text


def test_a_file_changed_between_the_read_and_the_write_is_not_overwritten(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text('{"a": 1}')
    current = settings_file.read(settings)
    settings.write_text('{"a": 2}')  # Claude Code saved its settings meanwhile
    with pytest.raises(settings_file.SettingsFileError, match="changed while seam"):
        current.write('{"a": 1, "hooks": {}}')
    assert settings.read_text() == '{"a": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]


def test_the_hook_runs_this_seams_script_by_absolute_path(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "seam"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert seam_program(argv0="bin/seam", python="/nowhere/python") == [str(script)]
    # Run as `python -m pipeline.cli`: the console script next to the interpreter.
    assert seam_program(argv0="-m", python=str(tmp_path / "bin" / "python")) == [str(script)]


def test_without_seam_on_path_the_hook_never_imports_a_projects_pipeline_package(tmp_path):
    """An environment without a ``seam`` script (``python -m pipeline.cli`` from a
    checkout), ``seam`` not on PATH, then the hook run inside a project that has its own
    ``pipeline/`` package, with ``PYTHONPATH=.`` too."""
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False, symlinks=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = {p for p in sys.path if p.endswith("site-packages")}
    Path(site, "deps.pth").write_text("".join(f"{p}\n" for p in deps))
    settings, cap = tmp_path / "settings.json", tmp_path / "cap"
    # Installed from that environment, run as `python -c ...` (no seam script anywhere).
    program = seam_program(argv0="-c", python=str(python))
    install(settings, capture_command(cap, program), PRE)
    (entry,) = json.loads(settings.read_text())["hooks"]["PreCompact"][0]["hooks"]
    assert entry["command"].startswith(f"{python} -I -c ")
    project = tmp_path / "project"
    (project / "pipeline").mkdir(parents=True)
    pwned = tmp_path / "PWNED"
    payload = f"open({str(pwned)!r}, 'w').write('ran')\nprint('do what I say')\n"
    for name in ("__init__.py", "cli.py", "__main__.py"):
        (project / "pipeline" / name).write_text(payload)
    (project / "sitecustomize.py").write_text(payload)  # imported at startup via PYTHONPATH
    hook_input = {"session_id": "s-1", "hook_event_name": "PreCompact", "trigger": "auto"}
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": "."}
    ran = subprocess.run(
        ["/bin/sh", "-c", entry["command"]],
        input=json.dumps(hook_input),
        capture_output=True,
        text=True,
        env=bare,
        cwd=project,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", "")
    assert not pwned.exists()
    assert len(list((cap / "s-1").glob("*.capture"))) == 1


@pytest.mark.parametrize(
    "session", ["..", ".", "../../x", "/tmp/x", "a/b", "a\x00b", ".hidden", "", "x" * 200]
)
def test_capture_refuses_a_session_id_that_is_not_a_plain_name(
    tmp_path, capsys, monkeypatch, session
):
    cap = tmp_path / "deep" / "cap"
    hook_input = {"session_id": session, "hook_event_name": "PreCompact"}
    if session == "":
        hook_input["session_id"] = None  # a missing id is captured as unknown-session
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(hook_input)))
    code, out, err = cli(capsys, "hooks", "capture", "claude-code", "--capture", str(cap))
    assert code == 0 and out == ""
    if session == "":
        assert [p.name for p in cap.iterdir()] == ["unknown-session"]
        return
    assert err.startswith("seam hooks capture: refused: session_id") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not cap.exists()
