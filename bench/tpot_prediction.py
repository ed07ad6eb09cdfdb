"""tpot_prediction: how well the slo policy predicts TPOT for decode over long and short contexts.

  .venv/bin/python bench/tpot_prediction.py [--bin build/release/bin] [--rounds 5]
      [--context-words 800] [--pause 0,0.3]

One decode worker (one thread) behind a router with --policy=slo. Each round sends 4 concurrent
greedy requests of 32 tokens over a shared prompt of --context-words words (about that many
tokens; the prefix cache holds it after the first round, so the streams decode over a long
context at the cost of a few prompt tokens), then 4 over short prompts. Between batches the
client waits --pause seconds: 0 is a closed-loop client that sends the next batch as soon as the
last one ends (within a load sample of the worker's), 0.3 lets the worker report its idle batch
first. Prints, per pause and kind, the median predicted and observed TPOT and the median
relative |error| (observed - predicted) / observed over the rounds after the first (which teaches
the corrections), and the step model the router fitted to the worker's start-up calibration.
"""
import argparse
import os
import pathlib
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

import grpc  # noqa: E402

WORDS = ["the", "river", "ran", "down", "to", "a", "sea"]


def run(args, pb, pause):
    from cluster_common import Cluster  # reads TANDEM_BIN_DIR when imported
    cluster = Cluster(prefill=0, decode=1, policy="slo", tag=f"tp{int(pause * 1000)}",
                      router_flags=["--default_ttft_ms=60000", "--default_tpot_ms=5000"])
    try:
        stub = pb.inference_grpc.InferenceStub(grpc.insecure_channel(cluster.grpc_address))
        prefix = " ".join(WORDS[i % len(WORDS)] for i in range(args.context_words))
        results = {"long": [], "short": []}
        lock = threading.Lock()

        def one(kind, i, round_):
            prompt = (f"{prefix} q{round_}x{i}: go on." if kind == "long"
                      else f"{round_}.{i}: hello there, say more.")
            last = None
            for m in stub.Generate(pb.inference.GenerateRequest(
                    prompt=prompt, sampling=pb.inference.SamplingParams(
                        max_tokens=32, temperature=0, ignore_eos=True)), timeout=300):
                last = m
            t = last.timings
            with lock:
                results[kind].append((round_, t.predicted_tpot_us / 1e3,
                                      (t.e2e_us - t.ttft_us) / 31 / 1e3))

        for round_ in range(args.rounds):
            for kind in ("long", "short"):
                threads = [threading.Thread(target=one, args=(kind, i, round_)) for i in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                time.sleep(pause)
        joined = [l.split("steps: ")[-1].strip().rstrip(")") for l in cluster.router.log
                  if " joined (" in l]
    finally:
        cluster.stop()
    print(f"\npause {pause:g} s between batches; calibrated step model: {joined[0] if joined else '?'}")
    print(f"{'kind':<7}{'predicted ms':>14}{'observed ms':>13}{'median |error|':>16}")
    for kind, rows in results.items():
        rows = [r for r in rows if r[0] > 0]
        if not rows:
            continue
        error = statistics.median(abs(o - p) / o for _, p, o in rows)
        print(f"{kind:<7}{statistics.median(p for _, p, _ in rows):>14.1f}"
              f"{statistics.median(o for _, _, o in rows):>13.1f}{error * 100:>15.0f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "build" / "release" / "bin"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context-words", type=int, default=800)
    ap.add_argument("--pause", default="0,0.3")
    args = ap.parse_args()
    if args.rounds < 2 or args.context_words < 1:
        ap.error("--rounds must be >= 2 and --context-words >= 1")
    os.environ["TANDEM_BIN_DIR"] = args.bin
    os.environ.setdefault("TANDEM_SOURCE_DIR", str(ROOT))
    from cluster_common import Protos
    pb = Protos()
    for pause in (float(p) for p in args.pause.split(",")):
        run(args, pb, pause)


if __name__ == "__main__":
    main()
