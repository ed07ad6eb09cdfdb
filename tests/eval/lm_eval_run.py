"""Runs lm-evaluation-harness on the local tasks in tandem_local/ and writes what it scored as JSON.
Runs inside .venv-lmeval (scripts/setup_lmeval.sh); lm_eval_test.py starts it.

Two models, one harness:
  --server URL  lm-eval's own `local-completions` model against Tandem's /v1/completions (what a
                user runs: token-id prompts, echo + logprobs for loglikelihood, stop + max_tokens
                for generate_until).
  --tandem BIN  TandemGenerateLM below: the same harness's requests answered by `BIN generate
                --json` in a process of its own (the engine alone: no router, no workers, no HTTP),
                from its prompt log-probabilities and its greedy tokens.

Both tokenize with one Hugging Face tokenizer built here from the GGUF file's vocabulary and merges
(PyPI tokenizers; the same pipeline as SmolLM2's published tokenizer.json and as
tests/tokenizer/tokenizer_reference_test.py), so both see the same token ids.

--write_tokenizer DIR only writes that tokenizer (for lm_eval's own command line, docs/api.md).

Output (--out): {"results": {task: {metric: value}}, "loglikelihood": {task: {doc_id: [[ll,
is_greedy], ... per choice]}}, "generations": {task: {doc_id: text}}, "requests": [{"context":
ids, "continuation": ids, "ll": float}] (TandemGenerateLM's loglikelihood requests only)}.
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

import gguf
import lm_eval
import transformers
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences
from lm_eval.tasks import TaskManager
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

TASKS_DIR = pathlib.Path(__file__).resolve().parent / "tandem_local"
TASKS = ["tandem_mc", "tandem_gen"]


def write_hf_tokenizer(gguf_path, out_dir):
    """A Hugging Face tokenizer folder for a GGUF file with SmolLM2's byte-level BPE."""
    reader = gguf.GGUFReader(str(gguf_path))

    def scalar(key):
        return reader.fields[key].contents()

    def array(key):
        f = reader.fields[key]
        return [f.contents(i) for i in range(len(f.data))]

    pre = scalar("tokenizer.ggml.pre")
    if scalar("tokenizer.ggml.model") != "gpt2" or pre != "smollm":
        sys.exit(f"{gguf_path}: only SmolLM2's byte-level BPE (pre-tokenizer smollm) is built here, "
                 f"got {pre!r}")
    tokens = array("tokenizer.ggml.tokens")
    types = array("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in array("tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=tokens[scalar("tokenizer.ggml.bos_token_id")],
        eos_token=tokens[scalar("tokenizer.ggml.eos_token_id")])
    fast.save_pretrained(str(out_dir))


class TandemGenerateLM(TemplateLM):
    """lm-eval's requests answered by `tandem generate --json` (the engine in one process)."""

    def __init__(self, binary, model, tokenizer_dir, jobs):
        super().__init__()
        self.binary, self.model, self.jobs = str(binary), str(model), jobs
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.requests = []  # the loglikelihood requests, for the caller's llama.cpp check

    # As lm-eval's TemplateAPI with the huggingface backend and add_bos_token=False, which
    # local-completions is: encoding without special tokens, BOS (else EOS) before an empty context.
    @property
    def eot_token_id(self):
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self):
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens)).input_ids

    def _generate(self, ids, *flags):
        args = [self.binary, "generate", f"--model={self.model}", "--threads=1", "--json",
                "--prompt_ids=" + ",".join(map(str, ids)), *flags]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:5])} ... failed ({p.returncode}): {p.stderr}")
        return json.loads(p.stdout)

    def _score(self, request):
        _, context, continuation = request
        out = self._generate(context + continuation, "--max_tokens=1", "--prompt_logprobs=1")
        # prompt_logprobs[i] scores prompt token i + 1 given the ones before it.
        scored = out["prompt_logprobs"][len(context) - 1:]
        assert [s["id"] for s in scored] == continuation, (scored, continuation)
        ll = sum(s["logprob"] for s in scored)
        greedy = all(s["top"][0]["id"] == s["id"] for s in scored)
        return ll, greedy

    def _loglikelihood_tokens(self, requests, **kwargs):
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            answers = list(pool.map(self._score, requests))
        for (_, context, continuation), (ll, _) in zip(requests, answers):
            self.requests.append({"context": context, "continuation": continuation, "ll": ll})
        return answers

    def _complete(self, request):
        context, gen_kwargs = request.args
        # What local-completions sends: the context's ids, greedy, max_gen_toks, and `until` with
        # the tokenizer's EOS string as stop strings.
        kwargs = dict(gen_kwargs)
        if kwargs.get("do_sample") or kwargs.get("temperature", 0) != 0:
            raise ValueError(f"only greedy generation is compared here, got {gen_kwargs}")
        stop = handle_stop_sequences(kwargs.get("until"), self.tokenizer.eos_token)
        if any("," in s for s in stop):
            raise ValueError(f"--stop is comma-separated; a stop string holds a comma: {stop}")
        max_tokens = kwargs.get("max_gen_toks", 256)
        out = self._generate(self.tok_encode(context), f"--max_tokens={max_tokens}",
                             "--stop=" + ",".join(stop))
        return out["text"]

    def generate_until(self, requests, disable_tqdm=False):
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            return list(pool.map(self._complete, requests))

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError("the local tasks have no loglikelihood_rolling requests")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--server", help="Tandem's /v1/completions URL")
    target.add_argument("--tandem", help="the tandem binary")
    target.add_argument("--write_tokenizer", metavar="DIR",
                        help="only write the Hugging Face tokenizer folder (for lm_eval's own "
                             "command line: tokenizer=DIR in its --model_args)")
    parser.add_argument("--model", required=True, help="the GGUF file the cluster serves")
    parser.add_argument("--work_dir", help="for the tokenizer and datasets' cache")
    parser.add_argument("--out")
    parser.add_argument("--jobs", type=int, default=2, help="tandem generate processes at once")
    args = parser.parse_args()
    # Absolute: the tasks run from their own folder (below).
    args.model = str(pathlib.Path(args.model).resolve())
    args.tandem = args.tandem and str(pathlib.Path(args.tandem).resolve())
    if args.write_tokenizer:
        write_hf_tokenizer(args.model, pathlib.Path(args.write_tokenizer))
        return
    if not args.work_dir or not args.out:
        parser.error("--server and --tandem need --work_dir and --out")

    work = pathlib.Path(args.work_dir).resolve()
    tokenizer_dir = work / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        write_hf_tokenizer(args.model, tokenizer_dir)
    if args.server:
        lm = "local-completions"
        model_args = (f"base_url={args.server},model={pathlib.Path(args.model).stem},"
                      f"tokenizer_backend=huggingface,tokenizer={tokenizer_dir},max_retries=1")
    else:
        lm = TandemGenerateLM(args.tandem, args.model, tokenizer_dir, args.jobs)
        model_args = None
    # The tasks' data_files are relative to their folder.
    os.chdir(TASKS_DIR)
    results = lm_eval.simple_evaluate(
        model=lm, model_args=model_args, tasks=TASKS,
        task_manager=TaskManager(include_path=str(TASKS_DIR)), log_samples=True, num_fewshot=0,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)

    out = {"results": {}, "loglikelihood": {}, "generations": {},
           "requests": [] if args.server else lm.requests}
    for task in TASKS:
        out["results"][task] = {k.split(",")[0]: v for k, v in results["results"][task].items()
                                if isinstance(v, (int, float)) and "_stderr" not in k
                                and "," in k}
        for sample in results["samples"][task]:
            if task == "tandem_mc":
                out["loglikelihood"].setdefault(task, {})[sample["doc_id"]] = [
                    [float(r[0][0]), bool(r[0][1])] for r in sample["resps"]]
            else:
                out["generations"].setdefault(task, {})[sample["doc_id"]] = sample["resps"][0][0]
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
