"""Secrets never reach an output: the rules one by one, then secrets planted in every place a real
run carries them (an --api-key flag, a password in the model path and in HF_ENDPOINT, a token in
the environment and in the server's log), run for real against the stand-in SGLang server through
the gate, smoke and `invoke report`, and every output searched for them."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from smoke_support import Rig, free_port, kill_leftovers

from stackgate.commands import gate, smoke
from stackgate.commands import report as reporting
from stackgate.edges.files import write_json
from stackgate.facts.serverlog import excerpt
from stackgate.flows.gate import GateRequest
from stackgate.flows.smoke import SmokeRequest
from stackgate.models.finding import Fix
from stackgate.models.redact import REDACTED, is_secret_name, redact, redact_text, secrets_in
from stackgate.models.result import Result, Status
from stackgate.models.spec import load_spec
from stackgate.render.reporting import junit_xml, redacted, write_junit
from stackgate.render.ui import UI
from stackgate.runs import fingerprint as fp

# --- the rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "python -m sglang.launch_server --model-path /m --api-key Zq9-secret-1 --port 30000",
            "python -m sglang.launch_server --model-path /m --api-key <redacted> --port 30000",
        ),
        ("launch --api-key=Zq9-secret-1 --tp-size 8", "launch --api-key=<redacted> --tp-size 8"),
        ("launch --enable-x --api-key 'Zq9 secret 1'", "launch --enable-x --api-key '<redacted>'"),
        ("--api-key: api_key='Zq9-secret-1'", "--api-key: api_key='<redacted>'"),
        (
            "server_args=ServerArgs(model_path='/m', api_key='Zq9-secret-1', admin_api_key=None, port=30000)",
            "server_args=ServerArgs(model_path='/m', api_key='<redacted>', admin_api_key=None, port=30000)",
        ),
        ('{"api_key": "Zq9-secret-1", "tp_size": 8}', '{"api_key": "<redacted>", "tp_size": 8}'),
        ("export HF_TOKEN=Zq9-secret-1", "export HF_TOKEN=<redacted>"),
        (
            "HF_ENDPOINT=https://hub-user:Zq9-secret-1@hub.example.com/api",
            "HF_ENDPOINT=https://hub-user:<redacted>@hub.example.com/api",
        ),
        ("git clone https://ghs_Zq9secret1Zq9secret1@github.com/o/r", "git clone https://<redacted>@github.com/o/r"),
        ("model_path='/mnt/ops:Zq9-secret-1@nas/llama'", "model_path='/mnt/ops:<redacted>@nas/llama'"),
        (
            "curl -H 'Authorization: Bearer Zq9-secret-1' http://127.0.0.1:30000/generate",
            "curl -H 'Authorization: Bearer <redacted>' http://127.0.0.1:30000/generate",
        ),
        ("401 Client Error for token hf_" + "a1B2" * 9, "401 Client Error for token <redacted>"),
    ],
)
def test_each_shape_is_hidden_where_it_stands(text, shown):
    assert redact_text(text, environ={}) == shown


@pytest.mark.parametrize(
    "text",
    [
        "[2026-01-12 10:00:27 TP0] Load weight end. elapsed=0.52 s, type=LlamaForCausalLM, avail mem=78.10 GB",
        "max_total_num_tokens=512000, chunked_prefill_size=8192, max_prefill_tokens=16384, context_len=131072",
        (
            "server_args=ServerArgs(model_path='/models/llama', tokenizer_path='/models/llama', "
            "speculative_token_map=None, "
            "api_key=None)"
        ),
        "Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        "invoke provision --lock lockfiles/blackwell-sm120-cu130.toml",
        "uv pip install torch==2.9.1+cu130 --index-url https://download.pytorch.org/whl/cu130",
    ],
)
def test_what_is_no_secret_is_left_as_it_is(text):
    assert redact_text(text, environ={}) == text


def test_names_words_not_substrings():
    assert [
        n for n in ("OPENAI_API_KEY", "hf_token", "x-api-key", "clientSecret", "DB_PASSWD") if is_secret_name(n)
    ] == ["OPENAI_API_KEY", "hf_token", "x-api-key", "clientSecret", "DB_PASSWD"]
    # fast mode's layer-count key, token counts, the tokenizer: no secrets
    plain = ("key", "output_tokens", "tokenizer_mode", "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "BYPASS_CACHE")
    assert [n for n in plain if is_secret_name(n)] == []


@pytest.mark.parametrize("name", ["PGPASSWORD", "MYSQL_PWD", "DB_PASS", "AWS_ACCESS_KEY_ID", "GITHUB_PAT"])
def test_the_names_an_audit_found_missing_name_secrets(name):
    assert is_secret_name(name)
    assert redact_text(f"export {name}=Zq7vLm2xK9", environ={}) == f"export {name}=<redacted>"
    doc = {"env": {name: "Zq7vLm2xK9"}, "log": "connecting with Zq7vLm2xK9"}
    assert redact(doc, environ={}) == {"env": {name: "<redacted>"}, "log": "connecting with <redacted>"}


@pytest.mark.parametrize(
    "token",
    [
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAY34FZKBOKMUTVV7A",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "github_pat_11ABCDEFG0abcdefghijklmn_opq",
        "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy",
        "xoxp-1234567890-abcdefghij",
        "sk_live_51H8xQ2eZvKYlo2C9aBcDeFgHiJ",
        "rk_test_4eC39HqLyjWDarjtT1zdp7dc",
        "glpat-xR4m9TqLw2Zp8VbN3kJd",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ],
)
def test_token_shapes_an_audit_found_missing_are_hidden_under_any_name(token):
    assert redact_text(f"FOO={token} in a log line", environ={}) == "FOO=<redacted> in a log line"
    assert token not in redact({"environment": {"FOO": token}, "note": f"saw {token}"}, environ={})["note"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("pull https://bot:p@ss88w0rd@hub.example/m", "pull https://bot:<redacted>@hub.example/m"),
        ("index=https://u:a@b@c@pypi.example/simple/ x@y", "index=https://u:<redacted>@pypi.example/simple/ x@y"),
        ("mirror bot:pw@8821x@host.example/m", "mirror bot:<redacted>@host.example/m"),
    ],
)
def test_a_url_password_holding_a_raw_at_sign_is_hidden_whole(text, shown):
    assert redact_text(text, environ={}) == shown


REFERENCE = 'flags = ["--api-key", "${SERVE_AUTH}", "--port", "80"]'


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('flags = ["--api-key", "sk-APIKEYlock7Qx9"]', 'flags = ["--api-key", "<redacted>"]'),
        ("flags = ['--enable-x', '--admin-api-key', 'k1']", "flags = ['--enable-x', '--admin-api-key', '<redacted>']"),
        ("serve --api-key 123456 --port 30000", "serve --api-key <redacted> --port 30000"),
        (REFERENCE, REFERENCE),  # a reference is shown
    ],
)
def test_a_value_after_a_secret_flag_is_hidden_whatever_its_length_or_shape(text, shown):
    assert redact_text(text, environ={}) == shown


def test_a_secret_found_in_one_place_is_hidden_in_every_other_at_any_depth():
    doc = {
        "sessions": [
            {
                "command": ["python", "--api-key", "Zq9-secret-1"],
                "server_info": {"api_key": "Zq9-secret-1", "internal_states": [{"api_key": "Zq9-secret-1"}]},
            }
        ],
        "results": [{"details": ["the server said: bad credential Zq9-secret-1", "--api-key: api_key='Zq9-secret-1'"]}],
        "fast_mode": {"key": "num_hidden_layers", "override": {"num_hidden_layers": 2}},
        "env": {"HF_ENDPOINT": "https://u:Endpoint-pw-9@hub", "mirror": "the password Endpoint-pw-9 again"},
    }
    shown = redact(doc, environ={})
    assert "Zq9-secret-1" not in json.dumps(shown) and "Endpoint-pw-9" not in json.dumps(shown)
    assert shown["sessions"][0]["server_info"]["internal_states"][0]["api_key"] == REDACTED
    assert shown["results"][0]["details"][0] == "the server said: bad credential <redacted>"
    assert shown["env"]["mirror"] == "the password <redacted> again"
    assert shown["fast_mode"] == doc["fast_mode"]  # a config field called "key" is no secret
    assert redact(shown, environ={}) == shown  # hiding twice changes nothing


def test_a_value_that_only_names_a_variable_is_no_secret_and_is_shown():
    text = "launch --api-key ${SERVE_AUTH} --admin-api-key=$ADMIN_KEY && export HF_TOKEN=$VAULT_TOKEN"
    assert redact_text(text, environ={}) == text
    doc = {
        "command": ["sglang", "--api-key", "${SERVE_AUTH}"],
        "env": {"HF_TOKEN": "${VAULT_TOKEN}"},
        "log": "${SERVE_AUTH} is set",
    }
    assert redact(doc, environ={}) == doc and secrets_in(doc, environ={}) == set()


def test_the_environment_s_secrets_are_hidden_by_value():
    environ = {"WANDB_API_KEY": "wandb-Zq9-secret-1", "PATH": "/usr/bin"}
    assert secrets_in({}, environ) == {"wandb-Zq9-secret-1"}
    assert (
        redact_text("login with wandb-Zq9-secret-1 on /usr/bin", environ=environ) == "login with <redacted> on /usr/bin"
    )


def test_every_json_and_junit_file_is_written_redacted_and_a_console_gets_redacted_results(tmp_path):
    leaky = Result(
        "smoke.flags",
        Status.FAIL,
        "1 flag differs",
        ("--api-key: asked 'Zq9-secret-1'",),
        Fix("Relaunch.", ("sglang --api-key Zq9-secret-1",)),
    )
    write_json(tmp_path / "r.json", {"results": [leaky.to_dict()]})
    write_junit(tmp_path / "r.xml", {"suite": [leaky]})
    assert "Zq9-secret-1" in junit_xml({"suite": [leaky]})  # the plain renderer shows what it is given
    for name in ("r.json", "r.xml"):
        assert (
            "Zq9-secret-1" not in (tmp_path / name).read_text()
            and REDACTED.strip("<>") in (tmp_path / name).read_text()
        )
    (shown,) = redacted([leaky], context={"command": ["sglang", "--api-key", "Zq9-secret-1"]})
    assert shown.details == ("--api-key: asked '<redacted>'",) and shown.fix.commands == (
        "sglang --api-key <redacted>",
    )


def test_a_quoted_log_line_is_cut_between_words_never_inside_a_secret():
    line = "RuntimeError: " + "x" * 270 + " credential Zq9-secret-1-of-the-user (401)"  # the secret spans character 300
    assert excerpt(line) == "RuntimeError: " + "x" * 270 + " credential ... (30 chars cut)"
    assert excerpt("short line, api_key='Zq9-secret-1'") == "short line, api_key='<redacted>'"


# --- the fingerprint ----------------------------------------------------------------------------


def test_the_fingerprint_hashes_no_secret():
    info = {
        "model_path": "https://ops:Zq9-secret-1@hub/m",
        "api_key": "Zq9-secret-1",
        "attention_backend": "flashinfer",
    }
    rotated = {
        "model_path": "https://ops:Other-secret-2@hub/m",
        "api_key": "Other-secret-2",
        "attention_backend": "flashinfer",
    }
    section = fp.server_section(info)
    assert section == fp.server_section(rotated) and "Zq9-secret-1" not in json.dumps(section)
    assert section["model_path"] == "https://ops:<redacted>@hub/m"


def test_a_lockfile_s_secret_does_not_change_its_fingerprint(tmp_path):
    base = (Path(__file__).resolve().parents[1] / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    digests = []
    for key in ("Zq9-secret-1", "Other-secret-2"):
        path = tmp_path / f"{key}.toml"
        path.write_text(
            base.replace("flags = [", f'env = {{ HF_TOKEN = "hf_{key}" }}\nflags = ["--api-key", "{key}", ')
        )
        section = fp.spec_section(load_spec(path))
        assert key not in json.dumps(section)
        digests.append(section["sha256"])
    assert digests[0] == digests[1]
    no_secret = load_spec(plain)
    assert fp.spec_section(no_secret) == {
        "name": no_secret.name,
        "sha256": no_secret.sha256,
    }  # as every report names it


# --- planted secrets, run for real --------------------------------------------------------------

API_KEY = "Planted-ApiKey-4f1d2c3b9a"  # matches no token format: found as a flag, by name and by value
MODEL_PASSWORD = "Hunter2-planted"
ENDPOINT_PASSWORD = "Endpoint-planted-77"
HF_TOKEN = "hf_PlantedToken" + "x" * 24
AWS_KEY_ID = "AKIAPLANTED7QX9ZZ4B"  # under a name that says nothing (FOO): found by its shape, or never recorded
UNRELATED = "Unrelated-value-31337"  # no secret by name or shape: a run records the variable's name only
SECRETS = (API_KEY, MODEL_PASSWORD, ENDPOINT_PASSWORD, HF_TOKEN, AWS_KEY_ID, UNRELATED)
VERIFIABLE = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
BENCH = {"output_tokens": 64, "runs": 2, "warmup": 1, "baseline_tok_s": 150.0, "max_regression": 0.5}


@dataclass
class Planted:
    folder: Path  #: every file the runs wrote (reports, kept runs, the HTML page), server logs aside
    console: dict[str, str]  #: what each command printed, stdout and stderr
    good: dict  #: the passing gate's JSON
    timed_out: dict  #: the gate whose server never became ready
    smoke: dict  #: the smoke whose server died, its last words naming the token and the key
    logs: Path  #: where the server logs were kept


def _run(name: str, console: dict[str, str], command) -> object:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = command(UI(stream=out, force_plain=True))
        finally:
            console[f"{name} stdout"], console[f"{name} stderr"] = out.getvalue(), err.getvalue()
    return code


@pytest.fixture(scope="module")
def planted(tmp_path_factory, plain_python):
    folder = tmp_path_factory.mktemp("planted")
    rig = Rig(tmp_path_factory.mktemp("rig"), free_port())
    model = rig.tmp / f"ops:{MODEL_PASSWORD}@nas" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32})
    )
    env = {"HF_ENDPOINT": f"https://hub-user:{ENDPOINT_PASSWORD}@hub.example.com", "HF_TOKEN": HF_TOKEN}
    spec = rig.spec(flags=("--api-key", API_KEY), env=env, benchmark=BENCH)
    spec.write_text(spec.read_text().replace(f'interpreter = "{sys.executable}"', f'interpreter = "{plain_python}"'))
    console: dict[str, str] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STACKGATE_NVML_MODULE", "fakes.fake_nvml")
        patch.setenv("STACKGATE_FAKE_NVML", str(rig.nvml_path))
        patch.setenv("STACKGATE_HISTORY_DIR", str(folder / "runs"))
        patch.setenv(
            "STACKGATE_LOG_DIR", str(rig.tmp / "logs")
        )  # server logs: the server's own words, not stackgate's output
        patch.setenv("FOO", AWS_KEY_ID)
        patch.setenv("SOME_TOOL_SETTING", UNRELATED)
        try:
            reports = {
                f"{kind}_path": folder / f"good.{suffix}"
                for kind, suffix in (("json", "json"), ("junit", "xml"), ("markdown", "md"), ("prom", "prom"))
            }
            request = GateRequest(spec_path=spec, model=str(model), verify_checks=VERIFIABLE, **reports)
            assert _run("gate", console, lambda ui: gate.run(request, ui)) == 0, console["gate stdout"]

            rig.behave(hang=True)
            never = rig.tmp / "never.toml"
            never.write_text(spec.read_text().replace("ready_timeout_s = 60", "ready_timeout_s = 2\nsilence_s = 60"))
            reports = {
                f"{kind}_path": folder / f"timed-out.{suffix}"
                for kind, suffix in (("json", "json"), ("junit", "xml"), ("markdown", "md"), ("prom", "prom"))
            }
            request = GateRequest(spec_path=never, model=str(model), verify_checks=VERIFIABLE, **reports)
            assert _run("timed-out gate", console, lambda ui: gate.run(request, ui)) == 1

            line = (
                f"OSError: 401 Client Error: Unauthorized for the token {HF_TOKEN}; upstream refused credential "
                f"{API_KEY}"
            )
            rig.behave(crash_at_start={"phase": "load", "lines": [line]})
            chosen = SmokeRequest(spec_path=spec, model=str(model), json_path=folder / "smoke.json")
            assert _run("smoke", console, lambda ui: smoke.run(chosen, ui)) == 1
        finally:
            kill_leftovers(rig)
        good, timed_out = (json.loads((folder / f"{name}.json").read_text()) for name in ("good", "timed-out"))
        runs = folder / "runs"
        for name, refs, html in (
            ("report", (), None),
            ("report A", (good["run_id"],), None),
            ("report A B", (good["run_id"], timed_out["run_id"]), None),
            ("report --html", (good["run_id"],), folder / "report.html"),
        ):
            assert (
                _run(
                    name,
                    console,
                    functools.partial(reporting.run, reporting.ReportRequest(runs=refs, html_path=html, runs_dir=runs)),
                )
                == 0
            )
    return Planted(folder, console, good, timed_out, json.loads((folder / "smoke.json").read_text()), rig.tmp / "logs")


def test_no_output_holds_a_planted_secret(planted):
    files = sorted(p for p in planted.folder.rglob("*") if p.is_file())
    kinds = {p.suffix for p in files}
    assert {".json", ".xml", ".md", ".prom", ".html"} <= kinds and len(
        list((planted.folder / "runs").glob("*.json"))
    ) == 3
    assert (
        "kept in" in planted.console["gate stderr"]
        and "what changed from A to B" in planted.console["report A B stdout"]
    )  # the console was caught
    assert any(p.name == "runs.sqlite3" for p in files)  # the run index holds no secret either: read as bytes
    leaks = [
        f"{path.relative_to(planted.folder)}: {secret}"
        for path in files
        for secret in SECRETS
        if secret.encode() in path.read_bytes()
    ]
    leaks += [f"{name}: {secret}" for name, text in planted.console.items() for secret in SECRETS if secret in text]
    assert leaks == []


def test_a_session_records_the_variables_that_explain_it_and_only_the_names_of_the_rest(planted):
    for session in (planted.smoke["smoke"]["sessions"][0], planted.good["gate"]["smoke"]["benchmark"]["sessions"][0]):
        recorded, names = session["environment"], session["environment_names_only"]
        unrelated = {"FOO", "SOME_TOOL_SETTING", "HOME"}
        assert unrelated <= set(names) and not unrelated & set(recorded)
        # a search path, the stack's family, the lock's tables
        assert {"PATH", "PYTHONPATH", "HF_TOKEN", "STACKGATE_FAKE_SGLANG"} <= set(recorded)
        assert not set(recorded) & set(names)


def test_the_secrets_were_there_and_are_hidden_where_they_stood(planted):
    (session,) = planted.good["gate"]["smoke"]["benchmark"]["sessions"]
    assert (
        f"--api-key {REDACTED}" in session["command_line"]
        and session["command"][session["command"].index("--api-key") + 1] == REDACTED
    )
    info = session["server_info"]
    assert info["api_key"] == REDACTED and info["internal_states"][0]["api_key"] == REDACTED
    for field in ("model_path", "tokenizer_path", "served_model_name"):
        assert f"/ops:{REDACTED}@nas/model" in info[field]
    assert (
        session["environment"]["HF_ENDPOINT"] == f"https://hub-user:{REDACTED}@hub.example.com"
        and session["environment"]["HF_TOKEN"] == REDACTED
    )
    flags = next(r for r in planted.good["results"] if r["check"] == "smoke.flags" and r["stage"] == "benchmark")
    assert flags["data"]["flags"] == ["--api-key", REDACTED] and flags["details"] == [
        f"--api-key: api_key='{REDACTED}'"
    ]
    server = planted.good["gate"]["fingerprint"]["components"]["server"]
    assert server["api_key"] == REDACTED and f"/ops:{REDACTED}@nas/model" in server["model_path"]
    died = next(r for r in planted.smoke["results"] if r["check"] == "smoke.launch")
    assert any(f"for the token {REDACTED}; upstream refused credential {REDACTED}" in line for line in died["details"])
    assert f"ops:{REDACTED}@nas" in planted.console["smoke stdout"]  # the console shows the failed launch, hidden


def test_a_launch_that_times_out_quotes_cut_log_lines_and_the_real_log_path(planted):
    launch = next(r for r in planted.timed_out["results"] if r["check"] == "smoke.launch")
    assert launch["summary"].startswith("not ready after 2 s")
    (args_line,) = [line for line in launch["details"] if "server_args=ServerArgs(" in line]
    assert len(args_line) < 360 and args_line.endswith(" chars cut)")
    never = next(r for r in planted.timed_out["results"] if r["check"] == "smoke.log.sglang-never-ready")
    (log,) = [s["log_path"] for s in planted.timed_out["gate"]["smoke"]["fast_smoke"]["sessions"]]
    assert f"tail -n 50 {log}" in never["fix"]["commands"] and Path(log).is_file()
    assert all(len(line) < 360 for line in never["details"])
    stdout = planted.console["timed-out gate stdout"]
    assert f"$ tail -n 50 {log}" in stdout and max(len(line) for line in stdout.splitlines()) < 400


def test_invoke_report_hides_the_secrets_of_a_run_kept_before_they_were_hidden(planted, tmp_path):
    """A run written by an older stackgate (or copied in) still holds its secrets: report shows
    it, compares it and renders it without them."""
    old = json.loads(json.dumps(planted.good))
    session = old["gate"]["smoke"]["benchmark"]["sessions"][0]
    session["command_line"] = session["command_line"].replace(f"--api-key {REDACTED}", f"--api-key {API_KEY}")
    session["server_info"]["internal_states"][0]["api_key"] = API_KEY
    old["results"][0]["details"] = [f"model /models/ops:{MODEL_PASSWORD}@nas/model: quoted by {HF_TOKEN}"]
    old["gate"]["fingerprint"]["components"]["server"]["model_path"] = (
        f"https://hub-user:{ENDPOINT_PASSWORD}@hub.example.com/m"
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    for run_id, doc in (("20250101T000000Z-gate-000001", old), (planted.good["run_id"], planted.good)):
        (runs / f"{run_id}.json").write_text(
            json.dumps({**doc, "run_id": run_id})
        )  # as kept then: not through stackgate's writer
    console: dict[str, str] = {}
    html = tmp_path / "page.html"
    for name, refs, page in (("A", ("-2",), None), ("A B", ("-2", "-1"), None), ("html", ("-2",), html)):
        assert (
            _run(
                name,
                console,
                functools.partial(reporting.run, reporting.ReportRequest(runs=refs, html_path=page, runs_dir=runs)),
            )
            == 0
        )
    assert "model_path: https://hub-user:<redacted>@hub.example.com/m ->" in console["A B stdout"]
    shown = {**console, "page": html.read_text()}
    assert [f"{name}: {secret}" for name, text in shown.items() for secret in SECRETS if secret in text] == []


def test_kept_server_logs_hold_the_raw_output_readable_only_by_their_owner_and_the_console_says_so(planted):
    logs = sorted(planted.logs.rglob("*.log"))
    assert len(logs) >= 3 and any(HF_TOKEN in p.read_text() for p in logs)  # the server's own words, unredacted
    assert {oct(p.stat().st_mode & 0o777) for p in logs} == {"0o600"}
    for name in ("gate stdout", "smoke stdout"):
        assert "readable only by its owner (mode 0600)" in planted.console[name], planted.console[name]


def test_diagnose_shows_an_unrecognised_failure_on_the_console_with_its_secrets_hidden(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.12/site-packages/flashinfer/decode.py", line 83, in plan\n'
        f"    fetch('https://bot:{MODEL_PASSWORD}@hub.example.com/m', token='{HF_TOKEN}')\n"
        f"ValueError: the hub refused {HF_TOKEN}\n"
    )
    argv = [sys.executable, "-m", "stackgate", "diagnose", str(log), "--json", str(tmp_path / "d.json")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 1 and "Not recognised by any entry (1):" in done.stdout, done.stdout + done.stderr
    assert f"ValueError: the hub refused {REDACTED}" in done.stdout
    assert f"https://bot:{REDACTED}@hub.example.com" in done.stdout
    for text in (done.stdout, done.stderr, (tmp_path / "d.json").read_text()):
        assert HF_TOKEN not in text and MODEL_PASSWORD not in text
