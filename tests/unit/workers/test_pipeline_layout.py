"""Stage layout and model splitting for pipeline parallelism (single process, no groups)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from orchestrator.spec import GPTModel, PPSchedule
from workers.loop.model import GPT
from workers.loop.pipeline import (
    PipelineLayoutError,
    StageLayout,
    StageUnion,
    build_schedule,
    check_splittable,
    split_model,
)

CFG = GPTModel(n_layers=8, n_heads=2, d_model=16, vocab_size=32, seq_len=8)


@pytest.mark.parametrize(
    ("pp", "virtual", "rank", "ids", "layers"),
    [
        (2, 1, 0, (0,), [range(0, 4)]),
        (2, 1, 1, (1,), [range(4, 8)]),
        (2, 2, 0, (0, 2), [range(0, 2), range(4, 6)]),
        (2, 2, 1, (1, 3), [range(2, 4), range(6, 8)]),
        (4, 2, 3, (3, 7), [range(3, 4), range(7, 8)]),
        (8, 1, 5, (5,), [range(5, 6)]),
    ],
)
def test_layout_loop_order(pp: int, virtual: int, rank: int, ids: tuple[int, ...],
                           layers: list[range]) -> None:
    lay = StageLayout.build(n_layers=8, pp=pp, virtual=virtual, pp_rank=rank)
    assert lay.num_stages == pp * virtual
    assert lay.stage_ids == ids
    assert [lay.layers(s) for s in ids] == layers


def test_layout_rejects_uneven_split() -> None:
    with pytest.raises(PipelineLayoutError, match="do not divide the model's 8 layers"):
        StageLayout.build(n_layers=8, pp=3, virtual=1, pp_rank=0)


def _full_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return GPT(CFG).state_dict()


def test_stages_partition_the_model_with_its_names_and_values() -> None:
    full = _full_state()
    seen: dict[str, torch.Tensor] = {}
    for rank in range(2):
        torch.manual_seed(0)
        model = GPT(CFG)
        lay = StageLayout.build(n_layers=8, pp=2, virtual=2, pp_rank=rank)
        for part in split_model(model, lay):
            for name, t in part.state_dict().items():
                assert name not in seen, f"{name} on two stages"
                seen[name] = t
    assert seen.keys() == full.keys()
    assert all(torch.equal(seen[k], full[k]) for k in full)


def test_stage_chain_equals_whole_model_forward() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    tokens = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    want = model(tokens)
    parts = {}
    for rank in range(2):
        lay = StageLayout.build(n_layers=8, pp=2, virtual=2, pp_rank=rank)
        parts.update(zip(lay.stage_ids, split_model(model, lay), strict=True))
    h = tokens
    for sid in range(4):
        h = parts[sid](h)
    assert torch.allclose(h, want, atol=1e-6)


def test_stage_union_names_match_the_unsplit_model() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    lay = StageLayout.build(n_layers=8, pp=2, virtual=2, pp_rank=0)
    union = StageUnion(split_model(model, lay))
    names = set(union.state_dict())
    assert "embed.tok.weight" in names and "layers.4.attn.wq.weight" in names
    assert not any(n.startswith(("layers.2.", "layers.6.", "lm_head")) for n in names)
    assert names <= set(model.state_dict())


def test_foreign_model_is_rejected_with_the_fix() -> None:
    with pytest.raises(PipelineLayoutError, match="model.kind: gpt or pp: 1"):
        check_splittable(nn.Sequential(nn.Linear(2, 2)))


def test_single_stage_schedules_refuse_virtual_stages() -> None:
    with pytest.raises(PipelineLayoutError, match="interleaved_1f1b"):
        build_schedule(stages=[object(), object()], kind=PPSchedule.ONE_F_ONE_B,  # type: ignore[list-item]
                       n_microbatches=4, loss_fn=lambda a, b: a)
