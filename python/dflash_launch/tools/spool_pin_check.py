"""gpu-check (f): a spool frame reaches the GPU from its pinned mapping (issue #49, item 4).

A frame is published to a private spool under the check's directory, read with SpoolSource(pin=True), and its
"hidden" view copied to the GPU with non_blocking=True on a side stream: on CUDA the view must be page-locked
(cudaHostRegister of the mapping, read-only) and the copy equal to what was published; on a CPU machine the same
path runs and the views stay pageable (ok, "no CUDA")."""

import os
import shutil


def gpu_check(mode, work):
    import torch

    from dflash_launch.spool import SpoolProducer, SpoolSource

    contract = {"batch": 1, "seq_len": 256, "hidden": 1024, "tapped_layers": [1, 2, 3], "dtype": "bf16",
                "vocab": 1000, "target_layers": 8, "seed": 0}
    root = os.path.join(str(work), "pinned-spool")
    shutil.rmtree(root, ignore_errors=True)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 256, 3 * 1024, generator=g).to(torch.bfloat16)
    tokens = torch.randint(0, 1000, (1, 256), generator=g)
    out = {"ok": False, "device": "cpu", "pinned": False, "equal": None, "note": ""}
    try:
        p = SpoolProducer(root, "check:0", contract, producers=1)
        p.publish(hidden, tokens)
        p.finish()
        src = SpoolSource(root, "check-drafter:0", contract, producers=1, pin=True)
        s = src.next_sample()
        cuda = mode == "cuda" and torch.cuda.is_available()
        out["pinned"] = bool(s["hidden"].is_pinned()) if cuda else False
        if cuda:
            out["device"] = "cuda"
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                on_gpu = s["hidden"].to("cuda", non_blocking=True)
            stream.synchronize()
            out["equal"] = bool(torch.equal(on_gpu.cpu(), hidden))
            del on_gpu
        else:
            out["equal"] = bool(torch.equal(s["hidden"], hidden))
            out["note"] = "no CUDA: the views stay pageable"
        s["ack"]()
        del s
        left = src.release()
        out["ok"] = out["equal"] and (out["pinned"] or not cuda) and left == 0
        out["note"] = out["note"] or ("pinned view, non-blocking H2D copy equal" if out["ok"] else
                                      "the frame's view was not pinned or the copy differs")
    except Exception as e:  # noqa: BLE001 -- the check reports, it does not crash the bundle
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def summary_line(c):
    return (f"  (f) pinned  {'ok  ' if c['ok'] else 'FAIL'} spool frame on {c['device']}: pinned {c['pinned']}, "
            f"equal {c['equal']}; {c['note']}")
