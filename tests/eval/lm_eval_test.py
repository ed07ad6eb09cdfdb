"""lm-evaluation-harness (PyPI lm-eval) against Tandem, as evaluation users run it.

The local tasks in tandem_local/ (our own 24 multiple-choice questions scored by log-likelihood and
16 short answers by greedy generation) run twice through the same harness (lm_eval_run.py, inside
.venv-lmeval): once with lm-eval's `local-completions` model against a real router + prefill +
decode cluster's /v1/completions, once answered by `tandem generate --json` (the engine alone, in
its own process). The scores must be equal: the same acc, acc_norm and exact_match, every
continuation's log-likelihood within LL_TOLERANCE and the same is_greedy, the same generated text.
The log-likelihoods are also compared with llama.cpp's (llama_cpp) on the same token ids.

Opt-in: lm-eval and its dependencies (~0.9 GB: datasets, pyarrow, pandas, scipy, scikit-learn,
transformers) live in .venv-lmeval, which scripts/setup_lmeval.sh makes (not scripts/setup.sh).
Without it the test skips, saying so; TANDEM_LM_EVAL=1 makes a missing environment a failure.
TANDEM_LMEVAL_VENV names another environment. About 3 minutes on 2 cores (the `tandem generate`
side starts one process per request, about a second each).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from cluster_common import BIN, ROOT, Cluster  # noqa: E402
from reference_common import DEFAULT_MODEL  # noqa: E402

VENV = Path(os.environ.get("TANDEM_LMEVAL_VENV", ROOT / ".venv-lmeval"))
PYTHON = VENV / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "lm_eval_run.py"

if not PYTHON.exists():
    why = (f"lm-evaluation-harness is opt-in: {VENV} does not exist; run scripts/setup_lmeval.sh "
           "to make it (~0.9 GB), then run this test again")
    if os.environ.get("TANDEM_LM_EVAL") == "1":
        pytest.fail(f"TANDEM_LM_EVAL=1 but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)

# The two sides compute the same tokens with the same kernels; they may batch differently (the
# cluster's workers), which changes float sums in the last bits only.
LL_TOLERANCE = 1e-3
# Mean |difference| per continuation token against llama.cpp: the engines differ by quantization
# noise on this Q4_1 model (as openai_echo_test's MAX_MEAN_DIFF).
LLAMA_MEAN_DIFF = 0.35
MC_DOCS, MC_CHOICES, GEN_DOCS = 24, 4, 16


def run_harness(work_dir, out, *target):
    env = dict(os.environ, HF_HOME=str(work_dir / "hf"), HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([str(PYTHON), str(DRIVER), *target, f"--model={DEFAULT_MODEL}",
                        f"--work_dir={work_dir}", f"--out={out}"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, f"lm_eval_run.py {target} failed:\n{p.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lm_eval")


@pytest.fixture(scope="module")
def served(work_dir):
    """The harness's scores through local-completions against a real cluster."""
    cluster = Cluster(prefill=1, decode=1, tag="lmeval-")
    try:
        url = f"http://127.0.0.1:{cluster.http_port}/v1/completions"
        return run_harness(work_dir, work_dir / "served.json", f"--server={url}")
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def local(work_dir, served):  # after `served`: one of them at a time on the cores
    """The harness's scores from `tandem generate --json`."""
    return run_harness(work_dir, work_dir / "local.json", f"--tandem={BIN / 'tandem'}")


def test_every_request_was_answered(served, local):
    for side in (served, local):
        docs = side["loglikelihood"]["tandem_mc"]
        assert len(docs) == MC_DOCS and all(len(c) == MC_CHOICES for c in docs.values())
        assert all(ll < 0 for choices in docs.values() for ll, _ in choices)
        assert len(side["generations"]["tandem_gen"]) == GEN_DOCS
    assert len(local["requests"]) == MC_DOCS * MC_CHOICES


def test_scores_are_equal(served, local):
    assert served["results"] == local["results"]
    assert set(served["results"]["tandem_mc"]) == {"acc", "acc_norm"}
    assert set(served["results"]["tandem_gen"]) == {"exact_match"}


def test_loglikelihoods_are_equal(served, local):
    for doc, choices in local["loglikelihood"]["tandem_mc"].items():
        got = served["loglikelihood"]["tandem_mc"][doc]
        for i, ((ll, greedy), (ll_http, greedy_http)) in enumerate(zip(choices, got)):
            assert abs(ll - ll_http) <= LL_TOLERANCE, (doc, i, ll, ll_http)
            assert greedy == greedy_http, (doc, i)


def test_generations_are_equal(served, local):
    assert served["generations"] == local["generations"]
    # The stop string "\n" ended them (max_gen_toks is 12): none is cut short.
    assert all(text.strip() and "\n" not in text
               for text in served["generations"]["tandem_gen"].values())


def test_loglikelihoods_are_near_llama_cpp(local):
    llama_cpp = pytest.importorskip("llama_cpp")  # in .venv, from scripts/setup.sh
    llm = llama_cpp.Llama(model_path=str(DEFAULT_MODEL), n_ctx=512, n_batch=512, logits_all=True,
                          n_threads=2, verbose=False, seed=0)
    diffs = []
    for r in local["requests"]:
        ids = r["context"] + r["continuation"]
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        n = len(r["context"])
        want = sum(logp[p - 1, ids[p]] for p in range(n, len(ids)))
        diffs.append(abs(r["ll"] - want) / len(r["continuation"]))
    assert np.mean(diffs) <= LLAMA_MEAN_DIFF, (np.mean(diffs), max(diffs))
