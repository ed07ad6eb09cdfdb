"""The `tandem` command as a user runs it: a real process, its output and exit codes."""
import os
import subprocess
from pathlib import Path

BIN = Path(os.environ["TANDEM_BIN_DIR"]) / "tandem"


def run(*args, env=None, timeout=60):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    full_env.update(env or {})
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def test_version_names_the_build_and_the_accelerators():
    p = run("version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("tandem 0.1.0 ")
    assert "cuda: " in p.stdout
    # A machine without a GPU says why instead of failing.
    assert "gpu 0: " in p.stdout or "gpus: none (" in p.stdout


def test_help_and_no_command_print_usage():
    for args in (("help",), ()):
        p = run(*args)
        assert p.returncode == 0
        assert "usage: tandem <command>" in p.stdout
        assert "up " in p.stdout


def test_unknown_command_is_a_usage_error():
    p = run("fly")
    assert p.returncode == 2
    assert "unknown command 'fly'" in p.stderr


def test_unknown_flag_is_a_usage_error():
    p = run("version", "--no_such_flag=1")
    assert p.returncode != 0
    assert "no_such_flag" in p.stderr


def test_flags_come_from_the_environment():
    p = run("version", env={"TANDEM_LOG_LEVEL": "loud"})
    assert p.returncode == 2
    assert "unknown log level 'loud'" in p.stderr
    # The command line wins over the environment.
    p = run("version", "--log_level=info", env={"TANDEM_LOG_LEVEL": "loud"})
    assert p.returncode == 0, p.stderr


def test_environment_typo_is_warned_about():
    p = run("version", env={"TANDEM_LOG_LEVLE": "debug"})
    assert p.returncode == 0
    assert "TANDEM_LOG_LEVLE matches no flag" in p.stderr


def test_up_with_a_missing_model_names_it(tmp_path):
    p = run("up", f"--model={tmp_path}/absent.gguf")
    assert p.returncode == 1
    assert "absent.gguf does not exist" in p.stderr
    p = run("up", env={"TANDEM_MODELS_DIR": str(tmp_path)})
    assert p.returncode == 1
    assert "default model is missing" in p.stderr and "scripts/setup.sh" in p.stderr


def test_up_finds_the_default_model_downloaded_by_setup():
    p = run("up")
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in p.stdout, p.stdout + p.stderr


def test_generate_streams_text_and_reports_speed():
    p = run("generate", "--prompt=The capital of France is", "--max_tokens=8", "--threads=2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip(), "no text generated"
    assert "prompt: 5 tokens in" in p.stderr and "tokens/s" in p.stderr
    assert "generated: 8 tokens" in p.stderr


def test_generate_chat_answers_with_the_template():
    p = run("generate", "--chat", "--prompt=What is the capital of France? Answer in one sentence.",
            "--max_tokens=40", "--threads=2")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout
    assert "[stop]" in p.stderr  # ended at <|im_end|>, not by length
    assert "<|im_end|>" not in p.stdout


def test_generate_same_seed_same_text():
    args = ("generate", "--prompt=Tell me a story.", "--max_tokens=16", "--temperature=0.9",
            "--seed=7", "--threads=2")
    a, b = run(*args), run(*args)
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout


def test_generate_bad_input_is_a_clear_error():
    cases = [
        (("--prompt=",), "empty"),
        (("--prompt=hi", "--temperature=-1"), "temperature"),
        (("--prompt=hi", "--top_p=0"), "top_p"),
        (("--prompt=hi", "--max_tokens=0"), "max_tokens"),
        (("--prompt=hi", "--max_tokens=100000"), "context"),
    ]
    for args, word in cases:
        p = run("generate", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert "INVALID_ARGUMENT" in p.stderr and word in p.stderr, (args, p.stderr)


def test_generate_on_a_malformed_model_names_the_file(tmp_path):
    source = Path(os.environ["TANDEM_SOURCE_DIR"]) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(source.read_bytes()[:4096])
    p = run("generate", f"--model={broken}", "--prompt=hi")
    assert p.returncode == 1
    assert "broken.gguf" in p.stderr
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("this is not a model\n" * 10)
    p = run("generate", f"--model={not_gguf}", "--prompt=hi")
    assert p.returncode != 0 and "text.gguf" in p.stderr
