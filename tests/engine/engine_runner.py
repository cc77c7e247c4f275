"""Start one vLLM engine, generate greedily for fixed prompts, write the results as JSON.

    python engine_runner.py --model DIR --tp N --out RESULT.json [--load-format F]
                            [--prompts JSON] [--max-tokens K] [--logprobs L]

Run by tests/engine/ in a subprocess of the engine venv, one engine per process, so that each
configuration starts clean and its logs (engine core and workers alike) are captured whole.
The result: {"vllm_version", "outputs": [{"prompt", "tokens", "logprobs": [{token id: logprob}
per step]}]}. A failure to start or to generate is a non-zero exit with vLLM's traceback on
stderr; no result file is written then.
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_PROMPTS = [[1, 17, 42, 99, 7, 200, 31], [1, 5, 250, 64, 128, 3, 77, 18, 240]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--prompts", default=json.dumps(DEFAULT_PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--logprobs", type=int, default=5)
    return ap.parse_args(argv)


def run(a: argparse.Namespace) -> dict:
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=a.model,
        skip_tokenizer_init=True,
        enforce_eager=True,
        tensor_parallel_size=a.tp,
        load_format=a.load_format,
        dtype="bfloat16",
        max_model_len=128,
        max_num_seqs=4,
        seed=0,
    )
    params = SamplingParams(
        temperature=0.0,
        max_tokens=a.max_tokens,
        logprobs=a.logprobs,
        ignore_eos=True,
        detokenize=False,
    )
    prompts = json.loads(a.prompts)
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    outputs = []
    for prompt, res in zip(prompts, results, strict=True):
        comp = res.outputs[0]
        steps = [
            {str(t): float(lp.logprob) for t, lp in step.items()} for step in comp.logprobs or []
        ]
        outputs.append({"prompt": prompt, "tokens": list(comp.token_ids), "logprobs": steps})
    return {
        "vllm_version": vllm.__version__,
        "tp": a.tp,
        "load_format": a.load_format,
        "outputs": outputs,
    }


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    result = run(a)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("engine_runner: done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
