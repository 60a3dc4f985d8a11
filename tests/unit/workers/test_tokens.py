"""Token files for the built-in loop: nanoGPT's headerless uint16 .bin and llm.c's headered
one (tests/fixtures/tokens, made by examples/data/make_tokens.py from tiny.txt) read the same
ids; each data-parallel rank reads only its own contiguous slice; a batch is a pure function
of the step (a resumed run reads what the uninterrupted one read); bad files and vocab sizes
are refused with the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.spec import SpecValidationError, parse_spec
from workers.loop.data import DataSource
from workers.loop.tokens import TokenFile, TokenFileError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "tokens"


def _spec(path: Path, **data: str):
    return parse_spec({"name": "t", "parallelism": {"dp_replicate": 2},
                       "model": {"vocab_size": 128, "seq_len": 16},
                       "training": {"micro_batch_size": 4},
                       "data": {"kind": "tokens", "path": str(path), **data}})


def test_nanogpt_and_llmc_layouts_hold_the_same_ids() -> None:
    plain, llmc = TokenFile.open(str(FIX / "tiny_nanogpt.bin")), TokenFile.open(str(FIX / "tiny_llmc.bin"))
    assert len(plain) == len(llmc) > 100
    assert np.array_equal(np.asarray(plain.tokens), np.asarray(llmc.tokens))
    assert plain.tokens.dtype == np.uint16 and int(np.asarray(plain.tokens).max()) < 128
    with pytest.raises(TokenFileError, match="no llm.c header"):
        TokenFile.open(str(FIX / "tiny_nanogpt.bin"), header="llmc")
    with pytest.raises(TokenFileError, match="version 1"):
        TokenFile.open(str(FIX / "tiny_llmc.bin"), dtype="uint32")


def test_each_dp_rank_reads_its_own_slice_and_batches_are_a_function_of_the_step() -> None:
    spec = _spec(FIX / "tiny_llmc.bin")
    tokens = np.asarray(TokenFile.open(str(FIX / "tiny_llmc.bin")).tokens)
    half = len(tokens) // 2
    for shard in (0, 1):
        src = DataSource(spec, seed=0, shards=[shard], vocab_size=128, seq_len=16,
                         device=torch.device("cpu"), num_shards=2)
        for step in range(1, 6):
            b = src.batches(step)[0]
            rows = torch.cat([b.inputs, b.targets[:, -1:]], dim=1).numpy()
            for row in rows:  # every row is a window of this shard's slice only
                starts = [i for i in range(shard * half, (shard + 1) * half - 16)
                          if np.array_equal(tokens[i:i + 17], row)]
                assert starts, (shard, step, row)
        again = DataSource(spec, seed=0, shards=[shard], vocab_size=128, seq_len=16,
                           device=torch.device("cpu"), num_shards=2)
        assert torch.equal(again.batches(4)[0].inputs, src.batches(4)[0].inputs)
    ref = DataSource(spec, seed=0, shards=[0, 1], vocab_size=128, seq_len=16,
                     device=torch.device("cpu"), num_shards=2)  # the single-process baseline
    r0 = DataSource(spec, seed=0, shards=[0], vocab_size=128, seq_len=16,
                    device=torch.device("cpu"), num_shards=2)
    assert torch.equal(ref.batches(2)[0].inputs[:4], r0.batches(2)[0].inputs)


def test_bad_token_files_are_refused_with_the_fix(tmp_path: Path) -> None:
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(TokenFileError, match="whole number"):
        TokenFile.open(str(odd))
    big = tmp_path / "big.bin"
    np.arange(1000, dtype=np.uint16).tofile(big)
    src = DataSource(_spec(big), seed=0, shards=[0], vocab_size=128, seq_len=16,
                     device=torch.device("cpu"), num_shards=2)
    with pytest.raises(TokenFileError, match="vocab_size"):
        src.batches(1)
    with pytest.raises(ValueError, match="fewer than"):
        DataSource(_spec(FIX / "tiny.txt"), seed=0, shards=[0], vocab_size=128, seq_len=500,
                   device=torch.device("cpu"), num_shards=2)
    with pytest.raises(SpecValidationError, match="data.dtype"):
        parse_spec({"name": "t", "data": {"kind": "tokens", "path": "/d/x.bin", "dtype": "int8"}})


def test_the_built_in_loop_trains_on_a_token_file(tmp_path: Path) -> None:
    from workers.loop.train import run_training

    spec = parse_spec({"name": "t", "model": {"n_layers": 1, "n_heads": 2, "d_model": 32,
                                              "vocab_size": 128, "seq_len": 16},
                       "training": {"steps": 30, "micro_batch_size": 4, "lr": 0.01},
                       "checkpoint": {"enabled": False},
                       "data": {"kind": "tokens", "path": str(FIX / "tiny_nanogpt.bin")}})
    losses: list[float] = []

    class Keep:
        def on_step(self, m):
            losses.append(m["loss"])

        def on_heartbeat(self, hb):
            pass

        def on_log(self, level, message):
            pass

    run_training(spec, out_dir=tmp_path, callbacks=Keep(), heartbeat_interval_s=0)
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < losses[0] - 0.5
