#!/usr/bin/env python3
"""Compare and summarise the outputs of scripts/gpu/check.sh. `compare.py WORLD OUT` prints one
line per check and writes OUT/train.json, bf16.json, kimi.json, dp.json, compare.json (every check)
and summary.json (all of it, with each stage's status, time and peak GPU memory);
`compare.py --memory OUT` prints each stage's peak GPU memory.

Tolerances (why):
- training loss, f32, CPU vs CUDA (12 steps): different summation orders, amplified by training;
  1e-3 relative on the first step, 2e-2 at any step. The same bound for the two CUDA processes
  (cold and warm kernel cache: autotuning may pick other kernels), which also reports whether
  they agree bit for bit;
- bf16 vs f32 training on the GPU (same steps): the CPU test's bounds
  (crates/aerie-train/tests/train/training.rs): the first-step loss within 2%; every step within
  5% (the CPU test's held-out bound after 30 steps); and the loss went down (last < first);
- two replicas (on one device: host-memory exchange; on two GPUs: NCCL) vs one replica
  accumulating the same two micro-batches: the same two gradients are added (g0 + g1, and float
  addition commutes), so 1e-5 relative at every step (a few float32 roundings), bit-for-bit
  equality reported; the NCCL check is "not run" on a machine with one GPU;
- capture, aux and final hidden (bf16 in the shard): a bf16 rounding boundary crossed by the two
  backends' f32 sums differs by one bf16 ulp (2^-8 relative), so compare with 2^-7 relative to the
  tensor's scale, and require 99.9% of values bitwise equal or within one ulp;
- eval loss: same weights and data on both backends, 1e-4 relative.
The Kimi-layer measurements carry no tolerance: tokens/s, peak GPU memory and MFU against the
H200's bf16 dense peak (PEAK_TFLOPS = 989), and the ratio aerie / SpecForge at each L.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np


def read_safetensors(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = body[a:b]
        if t["dtype"] == "BF16":
            v = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            v = np.frombuffer(buf, {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
                                    "F16": np.float16, "BOOL": np.bool_}[t["dtype"]])
        out[name] = v.reshape(t["shape"])
    return out


PEAK_TFLOPS = 989.0  # H200 SXM, bf16 dense (no sparsity)


def metrics(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if '"kind":"train"' in l]


def last_json(path):
    """The JSON a command printed on stdout: the last line that parses, else the whole text."""
    text = Path(path).read_text()
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return json.loads(text)


def stages(out):
    st = {}
    p = out / "stages.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            r = json.loads(line)
            st[r["stage"]] = r
    return st


def gpu_samples(out):
    samples = []
    p = out / "gpu_mem.txt"
    if p.exists():
        for line in p.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                samples.append((float(parts[0]), int(parts[1])))
    return samples


def stage_peak(samples, s):
    """Peak GPU memory in use (MiB) during stage record `s`, None if not sampled."""
    if not s or s.get("skipped"):
        return None
    inside = [m for t, m in samples if s["start"] <= t <= s["end"]]
    return max(inside, default=None)


def rel(a, b):
    return abs(a - b) / max(abs(a), 1e-30)


def run_report(w, out, st, samples, name, run):
    """Start-up, throughput and memory of one `aerie train` stage."""
    s = st.get(name)
    r = {"stage": name, "rc": s.get("rc") if s else None, "skipped": bool(s and s.get("skipped"))}
    if not s or s.get("skipped"):
        return r
    r["wall_s"] = s["end"] - s["start"]
    r["peak_gpu_mib"] = stage_peak(samples, s)
    f = out / f"{name}.first_step"
    m = metrics(w / run / "metrics.jsonl") if (w / run / "metrics.jsonl").exists() else []
    if f.exists():
        # process start -> the first metrics line (written when step 1 is done)
        r["time_to_first_step_s"] = float(f.read_text()) - s["start"]
    if m:
        r["steps"] = len(m)
        r["first_step_s"] = m[0]["elapsed_s"]  # step 1 alone (its kernels compile inside it)
        if "time_to_first_step_s" in r:
            r["setup_s"] = r["time_to_first_step_s"] - m[0]["elapsed_s"]  # load, before step 1
        r["loss"] = [x["loss"] for x in m]
        r["grad_norm"] = [x["grad_norm"] for x in m]
        r["step_elapsed_s"] = [x["elapsed_s"] for x in m]
        if len(m) > 1:
            dt = m[-1]["elapsed_s"] - m[0]["elapsed_s"]
            r["steps_per_s_after_first"] = (len(m) - 1) / dt if dt > 0 else None
            r["tokens_per_s_after_first"] = (m[-1]["tokens"] - m[0]["tokens"]) / dt if dt > 0 else None
    try:
        summ = last_json(out / f"{name}.out")
        r["status"] = summ.get("status")
        r["tokens_per_s"] = summ.get("tokens_per_s")
        r["elapsed_s"] = summ.get("elapsed_s")
    except (OSError, ValueError):
        pass
    cache = out / "kernel_cache.jsonl"
    if cache.exists():
        for line in cache.read_text().splitlines():
            try:
                c = json.loads(line)
            except ValueError:
                continue
            if c["stage"] == name:
                r["kernel_cache_after"] = {"files": c["files"], "bytes": c["bytes"]}
    return r


def curve(a, b, first_tol, max_tol):
    r = [rel(x, y) for x, y in zip(a, b)]
    return {"rel": r, "rel_first": r[0] if r else None, "rel_max": max(r) if r else None,
            "identical": a == b, "pass": bool(r) and len(a) == len(b) and r[0] <= first_tol and max(r) <= max_tol}


def main(w, out):
    w, out = Path(w), Path(out)
    results = {}
    st, samples = stages(out), gpu_samples(out)
    idle = min((m for _, m in samples), default=None)

    def check(name, passed, detail):
        results[name] = {"pass": None if passed is None else bool(passed), **detail}
        tag = "SKIP" if passed is None else ("PASS" if passed else "FAIL")
        print(f"{tag} {name}: {json.dumps(detail)}")

    def section(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and go on to the other checks
            check(fn.__name__, False, {"error": repr(e)})

    # 1. CUDA training to the end, twice (cold and warm kernel cache), against the CPU.
    train = {n: run_report(w, out, st, samples, n, run) for n, run in
             (("train_cpu", "run-cpu"), ("train_cuda_1", "run-cuda"), ("train_cuda_2", "run-cuda-2"))}

    def train_checks():
        c, g1, g2 = (train[n] for n in ("train_cpu", "train_cuda_1", "train_cuda_2"))
        for n, r in (("train_cuda_1", g1), ("train_cuda_2", g2)):
            if "loss" not in r:
                check(f"{n} ran to the end", None if r["skipped"] or r["rc"] is None else False, {"rc": r["rc"]})
                continue
            check(f"{n} ran to the end", r.get("status") == "completed" and r["steps"] == 12,
                  {k: r.get(k) for k in ("rc", "status", "steps", "wall_s", "time_to_first_step_s", "setup_s",
                                         "first_step_s", "steps_per_s_after_first", "tokens_per_s_after_first",
                                         "tokens_per_s", "peak_gpu_mib", "kernel_cache_after")})
            if "loss" in c:
                v = curve(c["loss"], r["loss"], 1e-3, 2e-2)
                train[f"{n}_vs_cpu"] = v
                check(f"{n} f32 loss vs cpu (1e-3 first, 2e-2 any step)", v["pass"],
                      {"cpu": c["loss"], "cuda": r["loss"], "rel_first": v["rel_first"], "rel_max": v["rel_max"]})
        if "loss" in g1 and "loss" in g2:
            v = curve(g1["loss"], g2["loss"], 1e-3, 2e-2)
            train["cuda_2_vs_cuda_1"] = v
            check("train_cuda_2 vs train_cuda_1 loss (1e-3 first, 2e-2 any step)", v["pass"],
                  {"identical": v["identical"], "rel_max": v["rel_max"]})
        if "time_to_first_step_s" in g1 and "time_to_first_step_s" in g2:
            t1, t2 = g1["time_to_first_step_s"], g2["time_to_first_step_s"]
            train["startup_cold_s"], train["startup_warm_s"] = t1, t2
            check("warm kernel cache starts faster", t2 < t1, {"cold_s": t1, "warm_s": t2, "warm_over_cold": t2 / t1})

    section(train_checks)
    (out / "train.json").write_text(json.dumps(train, indent=1))

    # 2. bf16 against f32 on the GPU, same steps.
    bf = {"run": run_report(w, out, st, samples, "train_cuda_bf16", "run-bf16")}

    def bf16_checks():
        b = bf["run"]
        if "loss" not in b:
            check("train bf16 vs f32 (cuda)", None if b["skipped"] or b["rc"] is None else False, {"rc": b["rc"]})
            return
        ref_name = "train_cuda_1" if "loss" in train["train_cuda_1"] else "train_cpu"
        ref = train[ref_name]["loss"]
        r = [rel(x, y) for x, y in zip(ref, b["loss"])]
        ok = len(r) == 12 and r[0] <= 0.02 and max(r) <= 0.05 and b["loss"][-1] < b["loss"][0]
        bf.update({"f32_reference": ref_name, "f32": ref, "bf16": b["loss"], "rel": r,
                   "tolerance": "first step 2%, every step 5%, last < first"})
        check("train bf16 vs f32 (cuda; 2% first, 5% any step, loss went down)", ok,
              {"reference": ref_name, "rel_first": r[0] if r else None, "rel_max": max(r) if r else None,
               "tokens_per_s": b.get("tokens_per_s"), "peak_gpu_mib": b.get("peak_gpu_mib")})

    section(bf16_checks)
    (out / "bf16.json").write_text(json.dumps(bf, indent=1))

    # 3. The Kimi-shaped layer: aerie's bench and SpecForge's step at each L.
    kimi = {"peak_tflops": PEAK_TFLOPS, "peak": "H200 bf16 dense", "gpu_idle_mib": idle}

    def kimi_checks():
        for L in (2048, 4096):
            row = {}
            a_st = st.get(f"kimi_aerie_L{L}")
            if a_st and not a_st.get("skipped") and a_st["rc"] == 0:
                a = last_json(out / f"kimi_aerie_L{L}.out")
                row["aerie"] = {"tokens_per_s": a["tokens_per_second"], "median_step_s": a["median_step_seconds"],
                                "precision": a["precision"], "flops_per_token": a["flops_per_token"],
                                "mfu": a["flops_per_token"] * a["tokens_per_second"] / (PEAK_TFLOPS * 1e12),
                                "peak_gpu_mib": stage_peak(samples, a_st), "wall_s": a_st["end"] - a_st["start"],
                                "trainable_params": a["trainable_params"], "embed_rows": a["embed_rows"]}
            elif a_st:
                row["aerie"] = {"rc": a_st.get("rc"), "skipped": bool(a_st.get("skipped"))}
            for name in (f"kimi_specforge_L{L}", f"kimi_specforge_eager_L{L}"):
                s_st = st.get(name)
                if s_st and not s_st.get("skipped") and s_st["rc"] == 0:
                    sf = last_json(out / f"{name}.out")
                    row["specforge"] = {k: sf[k] for k in (
                        "tokens_per_second", "tokens_per_second_incl_teacher", "median_step_seconds",
                        "median_step_seconds_excl_teacher", "median_teacher_seconds", "flops_per_token", "mfu",
                        "peak_allocated_mib", "peak_reserved_mib", "compile", "imports", "torch", "dtype",
                        "trainable_params", "embed_rows")}
                    row["specforge"]["stage"] = name
                    row["specforge"]["peak_gpu_mib"] = stage_peak(samples, s_st)
                    break
                if s_st:
                    row.setdefault("specforge_failed", []).append({"stage": name, "rc": s_st.get("rc"),
                                                                    "skipped": bool(s_st.get("skipped"))})
            if "tokens_per_s" in row.get("aerie", {}) and "specforge" in row:
                row["ratio_aerie_over_specforge"] = row["aerie"]["tokens_per_s"] / row["specforge"]["tokens_per_second"]
                row["ratio_aerie_over_specforge_incl_teacher"] = (
                    row["aerie"]["tokens_per_s"] / row["specforge"]["tokens_per_second_incl_teacher"])
            kimi[f"L{L}"] = row
            have = "ratio_aerie_over_specforge" in row
            check(f"kimi L{L} aerie / specforge", True if have else None,
                  {"ratio": row.get("ratio_aerie_over_specforge"),
                   "aerie_tokens_per_s": row.get("aerie", {}).get("tokens_per_s"),
                   "aerie_mfu": row.get("aerie", {}).get("mfu"),
                   "specforge_tokens_per_s": row.get("specforge", {}).get("tokens_per_second"),
                   "specforge_mfu": row.get("specforge", {}).get("mfu")})

    section(kimi_checks)
    (out / "kimi.json").write_text(json.dumps(kimi, indent=1))

    # 4. Two replicas (one GPU: host exchange; two GPUs: NCCL) vs one replica accumulating two
    # micro-batches.
    dp = {n: run_report(w, out, st, samples, n, run) for n, run in
          (("dp_two_replicas", "run-dp2"), ("dp_accum2", "run-acc2"), ("dp_nccl", "run-nccl"))}

    def dp_check(name, what):
        a, b = dp[name], dp["dp_accum2"]
        if "loss" not in a or "loss" not in b:
            ran = [r for r in (a, b) if not r["skipped"] and r["rc"] is not None]
            reason = (st.get(name) or {}).get("reason")
            check(f"dp {what} vs grad_accumulation 2", False if ran and any(r["rc"] for r in ran) else None,
                  {"rc": [a["rc"], b["rc"]], **({"not_run": reason} if reason else {})})
            return
        v = curve(b["loss"], a["loss"], 1e-5, 1e-5)
        dp[f"compare_{name}"] = v
        check(f"dp {what} vs grad_accumulation 2 (1e-5)", v["pass"] and len(a["loss"]) == len(b["loss"]),
              {"identical": v["identical"], "rel_max": v["rel_max"], "steps": len(a["loss"]),
               "tokens_per_s": [a.get("tokens_per_s"), b.get("tokens_per_s")]})

    def dp_host():
        dp_check("dp_two_replicas", "two replicas on cuda:0 (host exchange)")

    def dp_nccl():
        dp_check("dp_nccl", "cuda:0,cuda:1 (NCCL all-reduce)")

    section(dp_host)
    section(dp_nccl)
    (out / "dp.json").write_text(json.dumps(dp, indent=1))

    # 5. Capture, eval and decode on the GPU against the CPU (when there was time).
    def capture():
        if not (w / "shards-cuda/shard-00000.safetensors").exists():
            check("capture", None, {"missing": "shards-cuda"})
            return
        gpu = read_safetensors(w / "shards-cuda/shard-00000.safetensors")
        cpu = read_safetensors(w / "shards/train/shard-00000.safetensors")
        for name, c in cpu.items():
            g = gpu[name][: c.shape[0]] if gpu[name].shape != c.shape else gpu[name]
            if c.dtype.kind == "f":
                scale = float(np.abs(c).max()) or 1.0
                d = np.abs(g.astype(np.float64) - c)
                r = d / np.maximum(np.abs(c), 1e-30)
                within = float(np.mean((d == 0) | (r <= 2 ** -8 + 1e-9)))
                check(f"capture {name}", d.max() <= 2 ** -7 * scale and within >= 0.999,
                      {"max_abs": float(d.max()), "scale": scale, "frac_within_1ulp": within, "shape": list(c.shape)})
            else:
                check(f"capture {name}", np.array_equal(g, c), {"shape": list(c.shape)})

    def eval_loss():
        if not (out / "eval_cuda.out").exists():
            check("eval", None, {"missing": "eval_cuda.out"})
            return
        ec, eg = last_json(out / "eval_cpu.out"), last_json(out / "eval_cuda.out")
        r = rel(ec["loss"], eg["loss"])
        check("eval loss cpu vs cuda", r <= 1e-4,
              {"cpu": ec["loss"], "cuda": eg["loss"], "rel": r, "tau_cpu": ec["simulated_accept_length"],
               "tau_cuda": eg["simulated_accept_length"]})

    def decode():
        if not (out / "decode_cuda.json").exists():
            check("decode", None, {"missing": "decode_cuda.json"})
            return
        d = json.loads((out / "decode_cuda.json").read_text())
        check("decode cuda", True, {k: d[k] for k in d if not isinstance(d[k], (list, dict))})

    for fn in (capture, eval_loss, decode):
        section(fn)

    (out / "compare.json").write_text(json.dumps(results, indent=1))
    run = {}
    for f in ("run.json",):
        if (out / f).exists():
            run = json.loads((out / f).read_text())
    gpu = (out / "gpu.csv").read_text().strip().splitlines()[-1] if (out / "gpu.csv").exists() else None
    summary = {
        "gpu": gpu, "run": run, "gpu_idle_mib": idle,
        "stages": [dict(v, wall_s=(v["end"] - v["start"]) if "end" in v else None, peak_gpu_mib=stage_peak(samples, v))
                   for v in st.values()],
        "train": train, "bf16": bf, "kimi": kimi, "dp": dp,
        "checks": {k: v["pass"] for k, v in results.items()},
        "failed": [k for k, v in results.items() if v["pass"] is False],
        "not_run": [k for k, v in results.items() if v["pass"] is None],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("ALL RUN CHECKS PASS" if not summary["failed"] else "SOME CHECKS FAILED",
          f"({len(summary['not_run'])} not run)")


def memory(out):
    """Each stage's peak GPU memory in use (MiB), from check.sh's 0.2 s samples."""
    out = Path(out)
    samples = gpu_samples(out)
    base = min((m for _, m in samples), default=0)
    for s in stages(out).values():
        if s.get("skipped"):
            print(f"{s['stage']}: skipped")
            continue
        peak = stage_peak(samples, s)
        print(f"{s['stage']}: rc {s['rc']}, {s['end'] - s['start']:.1f} s, peak GPU memory "
              f"{peak if peak is not None else 'n/a'} MiB (idle {base} MiB)")


if __name__ == "__main__":
    if sys.argv[1] == "--memory":
        memory(sys.argv[2])
    else:
        main(*sys.argv[1:3])
