"""The environment file: what provision writes is what verify and smoke read back."""

from __future__ import annotations

import subprocess

import pytest

from stackgate.models import envfile


def test_render_then_parse_round_trips_awkward_values(tmp_path):
    values = {"CUDA_HOME": "/usr/local/cuda-13.0", "ODD": 'a "quoted" `tick` \\ back  spaced'}
    text = envfile.render(values, header="written by stackgate")
    assert text.startswith("# written by stackgate\n")
    assert envfile.parse(text, {}) == values
    path = tmp_path / "stackgate.env"
    path.write_text(text)
    shell = subprocess.run(["sh", "-c", f'. {path}; printf "%s" "$ODD"'], capture_output=True, text=True, check=True)
    assert shell.stdout == values["ODD"]


def test_a_shell_sourcing_the_file_sees_what_parse_sees(tmp_path):
    text = envfile.render({"CUDA_HOME": "/opt/cuda-13.0", "PATH": "/opt/cuda-13.0/bin:$PATH", "NCCL_P2P_LEVEL": "SYS"})
    path = tmp_path / "stackgate.env"
    path.write_text(text)
    shell = subprocess.run(
        ["sh", "-c", f'. {path}; printf \'%s\\n\' "$CUDA_HOME" "$PATH" "$NCCL_P2P_LEVEL"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    parsed = envfile.parse(text, {"PATH": "/usr/bin:/bin"})
    assert shell.stdout.splitlines() == [parsed["CUDA_HOME"], parsed["PATH"], parsed["NCCL_P2P_LEVEL"]]
    assert parsed["PATH"] == "/opt/cuda-13.0/bin:/usr/bin:/bin"


def test_apply_without_a_file_changes_nothing(tmp_path):
    assert envfile.apply(tmp_path / "absent.env", {"A": "1"}) == ({"A": "1"}, {})
    assert envfile.apply(None, {"A": "1"}) == ({"A": "1"}, {})


@pytest.mark.parametrize("line", ["rm -rf /", 'export X="unterminated', "1X=2"])
def test_lines_that_are_not_assignments_are_refused_with_their_number(tmp_path, line):
    path = tmp_path / "stackgate.env"
    path.write_text(f"# header\nexport A=1\n{line}\n")
    with pytest.raises(envfile.EnvFileError, match=f"{path}: line 3"):
        envfile.read(path, {})
