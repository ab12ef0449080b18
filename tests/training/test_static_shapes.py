"""Static shapes per phase and the whole-model compile, checked on CPU: real loader batches of
one shape (through the end of an epoch), a whole tiny model compiled with fullgraph=True over 20
of them without a recompile or a host sync inside its graphs, and padding that changes no loss.

The compiled model traces with the aot_eager backend: dynamo's graph capture, guards and
recompiles and AOTAutograd's forward and backward graphs are inductor's, without its C++ code
generation (about 130 s for the tiny model on this machine, against 5 s)."""
from __future__ import annotations

import json

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from model.attention import BatchLayout
from model.bert import bert_tiny
from model.compiling import compile_model
from model.heads import BertForPreTraining
from tests.support.shard_fixtures import read_rows
from training.batching import StaticShapes, collate, static_shapes_for
from training.loader import LoaderConfig, ShardLoader
from training.sync_check import SyncCounter

STEPS = 20


def static_config(folder, batch_size: int, attention_plan: bool = False) -> LoaderConfig:
    """The loader of a phase on `folder`'s shards with static shapes from their manifest."""
    manifest = json.loads((folder / "manifest.json").read_text())
    seq = manifest["max_seq_length"]
    return LoaderConfig(source=str(folder), batch_size=batch_size, max_seq_length=seq,
                        shuffle_buffer=100, attention_plan=attention_plan,
                        static_shapes=static_shapes_for(manifest, seq))


def signature(batch: dict) -> dict:
    """Every tensor's (shape, dtype), and the layout."""
    return {k: v if k == "layout" else (tuple(v.shape), v.dtype) for k, v in batch.items()}


def take(loader: ShardLoader, count: int) -> list[dict]:
    batches = iter(loader)
    return [next(batches) for _ in range(count)]


@pytest.fixture
def fresh_dynamo():
    """A compile cache and counters of this test's own, and error_on_recompile put back."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=False):
        yield
    torch._dynamo.reset()


def test_static_shapes_of_the_shards_manifests(data):
    """Unpacked rows: one instance, max_predictions_per_seq positions; packed rows at 512
    tokens: 16 instances and 76 + 16 positions (the books' packed rows reach 11 and 78)."""
    shapes = [static_shapes_for(json.loads((data[k] / "manifest.json").read_text()), seq)
              for k, seq in (("learn", 128), ("long", 512))]
    assert shapes == [StaticShapes(predictions=20, instances=1),
                      StaticShapes(predictions=92, instances=16)]
    assert static_shapes_for({}, 128) == StaticShapes(20 + 4, 4)  # unknown: packed, 20 at 128
    assert StaticShapes(20, 1).fit(19, 1) == (20, 1)
    assert StaticShapes(20, 1).fit(21, 1) == (24, 1)
    assert StaticShapes(92, 16).fit(93, 17) == (96, 32)


@pytest.mark.parametrize(("kind", "batch_size", "expected", "dynamic_shapes"), [
    ("learn", 8, {"input_ids": (8, 128), "masked_lm_positions": (8, 20),
                  "next_sentence_label": (8,)}, 1),
    ("long", 4, {"input_ids": (4, 512), "masked_lm_positions": (4, 92),
                 "next_sentence_label": (4, 16), "cls_positions": (4, 16)}, 5),
])
def test_twenty_loader_batches_of_a_phase_have_one_shape(data, kind, batch_size, expected,
                                                         dynamic_shapes):
    """The same 20 batches without static shapes take `dynamic_shapes` shapes: at 128 tokens
    the books' rows fill the row and mask 19 tokens each (one shape, not the phase's static
    one); packed at 512, 76 or 77 masked positions and 1 to 3 instances per row."""
    config = static_config(data[kind], batch_size)
    batches = take(ShardLoader(config), STEPS)
    first = signature(batches[0])
    assert all(signature(b) == first for b in batches)
    assert {k: first[k][0] for k in expected} == expected
    assert {k: v[1] for k, v in first.items() if k != "layout"} == dict.fromkeys(
        ["input_ids", "token_type_ids", "attention_mask", "sequence_ids", "position_ids",
         "masked_lm_positions", "masked_lm_ids", "next_sentence_label",
         *(["cls_positions"] if kind == "long" else [])], torch.int64)
    assert first["layout"] == BatchLayout(None, masked=True)
    dynamic = take(ShardLoader(LoaderConfig(config.source, batch_size, config.max_seq_length,
                                            shuffle_buffer=100)), STEPS)
    shapes = {str(signature(b) | {"layout": None}) for b in dynamic}
    assert len(shapes) == dynamic_shapes
    assert str(first | {"layout": None}) not in shapes


def test_the_shape_holds_through_the_end_of_an_epoch_and_a_short_batch(data):
    """84 rows in batches of 8: 10 batches an epoch (4 rows cut); 25 batches span two epoch
    ends. A batch of fewer rows is padded to the micro-batch: no token, no label."""
    loader = ShardLoader(static_config(data["uneven"], 8))
    batches = take(loader, 25)
    assert (loader.batches_per_epoch(), loader.epoch) == (10, 2)
    assert {str(signature(b)) for b in batches} == {str(signature(batches[0]))}
    rows = read_rows(data["uneven"])[:3]
    short = collate(rows, max_seq_length=128, attention_plan=False, static=StaticShapes(20, 1),
                    batch_size=8)
    assert signature(short) == signature(batches[0])
    assert short["attention_mask"].sum(1).tolist() == [len(r.input_ids) for r in rows] + [0] * 5
    assert (short["masked_lm_ids"][3:] == -100).all() and (short["next_sentence_label"][3:] == -100).all()
    assert (short["sequence_ids"][3:] == -1).all()


@pytest.mark.parametrize("kind", ["learn", "long"])
def test_static_padding_changes_no_loss(data, kind):
    """The same rows as the loader pads them by default (with the CPU's per-instance plan) and
    padded to the static shapes (whole rows under the mask): the same losses and counts."""
    rows = read_rows(data[kind])[:4]
    seq = 128 if kind == "learn" else 512
    static = static_config(data[kind], 4).static_shapes
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=2000)).eval()
    with torch.no_grad():
        plain = model(**collate(rows, max_seq_length=seq))
        padded_batch = collate(rows, max_seq_length=seq, static=static, batch_size=4)
        padded = model(**padded_batch)
    assert padded_batch["masked_lm_positions"].shape[1] > max(len(r.masked_lm_positions)
                                                             for r in rows)
    for name in ("mlm_count", "mlm_correct", "nsp_count", "nsp_correct"):
        assert getattr(padded, name).item() == getattr(plain, name).item(), name
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(padded, name), getattr(plain, name), rtol=0,
                                   atol=1e-6, msg=name)


class GraphSyncs:
    """An aot_eager backend that counts the forward and backward graphs it compiles and runs
    each under `SyncCounter`: the project's CPU proxy for a host-device sync, applied to the
    aten ops of the compiled graphs themselves (a dispatch mode around a compiled call would
    make dynamo skip the frame instead)."""

    def __init__(self):
        self.compiled, self.runs, self.counter = 0, 0, SyncCounter()
        self.backend = aot_autograd(fw_compiler=self.wrap, bw_compiler=self.wrap)

    def wrap(self, graph: torch.fx.GraphModule, example_inputs):
        self.compiled += 1
        run_graph = make_boxed_func(graph)

        def run(args):
            self.runs += 1
            with self.counter:
                return run_graph(args)

        run._boxed_call = True
        return run


def test_the_graph_sync_check_sees_a_sync_inside_a_graph(fresh_dynamo):
    syncs = GraphSyncs()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch.compile(lambda x: x[x > 0].sum(), backend=syncs.backend, fullgraph=True)(
            torch.randn(8))
    assert syncs.counter.ops == ["index (boolean index)"]


def test_the_whole_model_compiles_once_for_twenty_batches_without_a_sync(data, fresh_dynamo):
    """fullgraph=True: one frame, one forward and one backward graph for the phase; from the
    second step on a recompile is an error; no sync op runs in the graphs."""
    config = static_config(data["learn"], 8)
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=2000)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    syncs = GraphSyncs()
    compile_model(model, backend=syncs.backend)
    losses = []
    for step, batch in enumerate(take(ShardLoader(config), STEPS)):
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            out = model(**batch)
            out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    assert counters["stats"]["unique_graphs"] == 1
    assert dict(counters["graph_break"]) == {}
    assert (syncs.compiled, syncs.runs) == (2, 2 * STEPS)
    assert syncs.counter.ops == []
    assert all(torch.isfinite(torch.tensor(losses)))
    with SyncCounter() as eager:  # the class's forward is not compiled: the step as gpu_check
        BertForPreTraining.forward(model, **batch).loss.backward()  # counts it on CPU
    assert eager.ops == []


def test_a_compiled_model_takes_whole_rows_with_a_plan_or_without_a_layout(data, fresh_dynamo):
    """In a compiled graph attention takes whole rows: the CPU's per-instance plan (index
    tensors sized by each batch's instances) would compile the graph again for every batch, and
    working the layout out from the ids is host work (a graph break). The losses are the eager
    model's."""
    config = static_config(data["long"], 4, attention_plan=True)
    batches = [b for b in take(ShardLoader(config), STEPS) if b["layout"].plan is not None][:3]
    assert len({tuple(g.index.shape for g in b["layout"].plan.groups) for b in batches}) > 1
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=2000)).eval()
    with torch.no_grad():
        eager = [model(**b).loss for b in batches]
        compile_model(model, backend="aot_eager")
        compiled = [model(**batches[0]).loss]
        with torch._dynamo.config.patch(error_on_recompile=True):
            compiled += [model(**b).loss for b in batches[1:]]
        without_layout = model(**{k: v for k, v in batches[0].items() if k != "layout"}).loss
    assert counters["stats"]["unique_graphs"] == 2  # with a layout, then without one
    torch.testing.assert_close(torch.stack(compiled), torch.stack(eager), rtol=0, atol=1e-5)
    torch.testing.assert_close(without_layout, eager[0], rtol=0, atol=1e-5)


def test_a_gpu_run_pads_to_static_shapes_and_a_cpu_run_does_not(data):
    """`engine.static_shapes=auto` (every preset): where the whole step compiles (a GPU, `compile`,
    ZeRO 0-2: base and large) the phase's loaders, training and validation, pad to the shards'
    static shapes; not tiny's (no compile), ZeRO-3 or the CPU; `on` forces it."""
    from training import config as cfg
    from training.pretrain import build_loader
    from training.ranks import Dist

    phase = cfg.PhaseConfig(name="phase2", train_shards=str(data["long"]), max_seq_length=512,
                            micro_batch_size=4, global_batch_size=4, steps=1, warmup_steps=0)
    gpu, cpu = Dist(0, 1, on_gpu=True), Dist(0, 1, on_gpu=False)
    static = StaticShapes(92, 16)
    for preset in ("base", "large"):
        run = cfg.PRESETS[preset]()
        assert run.engine.static_shapes == "auto"
        assert [build_loader(run, phase, gpu, validation=v).static_shapes
                for v in (False, True)] == [static, static]
        assert build_loader(run, phase, cpu).static_shapes is None
        zero3 = cfg.apply_overrides(run, ["engine.zero_stage=3"])
        assert build_loader(zero3, phase, gpu).static_shapes is None
    assert build_loader(cfg.tiny(), phase, gpu).static_shapes is None
    compiled = cfg.apply_overrides(cfg.tiny(), ["engine.compile=true"])
    assert build_loader(compiled, phase, gpu).static_shapes == static
    forced = cfg.apply_overrides(cfg.tiny(), ["engine.static_shapes=on"])
    assert build_loader(forced, phase, cpu).static_shapes == static
    off = cfg.apply_overrides(cfg.large(), ["engine.static_shapes=off"])
    assert build_loader(off, phase, gpu).static_shapes is None


def test_gpu_check_runs_each_shape_both_ways_side_by_side(capsys):
    """`--paths dynamic,static`: a line per shape and path, the same first loss (the padding
    changes nothing); on CPU both run eagerly and are checked for syncs."""
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_check

    assert gpu_check.main(["--device", "cpu", "--steps", "1", "--seq_lens", "128",
                           "--paths", "dynamic,static"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "T=128" in line]
    assert [re.match(r"bert_tiny +T=128 B= 4( static)?:", line)[1] for line in lines] == [
        None, " static"]
    assert all(line.endswith("no math SDPA, no sync") for line in lines)
    first = {re.search(r"loss ([\d.]+) ->", line)[1] for line in lines}
    assert len(first) == 1
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--paths", "fixed"])


def test_a_pretraining_run_with_static_shapes_has_the_losses_of_one_without(data, tmp_path):
    """bert-pretrain on the packed 512-token shards (ZeRO-1, fp32, no dropout), with
    `engine.static_shapes=on` and `off`: the same loss at every step."""
    from tests.training.pretrain_runs import make_config, train_losses
    from training import pretrain
    from training.config import PhaseConfig

    phase = PhaseConfig(name="phase1", train_shards=str(data["long"]), max_seq_length=512,
                        micro_batch_size=4, global_batch_size=4, steps=3, warmup_steps=1,
                        learning_rate=2e-3)
    losses = {}
    for mode in ("off", "on"):
        pretrain.run(make_config(data, tmp_path / mode, phases=(phase,),
                                 engine={"zero_stage": 1, "static_shapes": mode},
                                 data={"num_workers": 0}))
        losses[mode] = train_losses(tmp_path / mode)
    assert len(losses["on"]) == 3
    torch.testing.assert_close(torch.tensor(losses["on"]), torch.tensor(losses["off"]),
                               rtol=0, atol=1e-5)


def test_a_deepspeed_engine_runs_the_compiled_model_without_a_recompile(data, fresh_dynamo):
    """The GPU path's order (training/pretrain.py `run_phase`): the model compiled, then
    `deepspeed.initialize` (ZeRO-2, fp32) and `train_step` over 4 batches of a phase. The
    engine's forward pre-hook reads its step counter: compiled into the graph (as
    `nn.Module.compile` would), it failed a guard at every step."""
    from training import config as cfg
    from training import pretrain

    phase = cfg.PhaseConfig(name="phase1", train_shards=str(data["long"]), max_seq_length=512,
                            micro_batch_size=4, global_batch_size=4, steps=4, warmup_steps=1)
    run = cfg.PretrainConfig(model=cfg.ModelConfig(preset="bert_tiny"), phases=(phase,),
                             engine=cfg.EngineConfig(zero_stage=2, static_shapes="on"),
                             data=cfg.PretrainDataConfig(vocab_dir=str(data["vocab"])))
    dist = pretrain.init_distributed()
    model = pretrain.build_model(run, pretrain.shard_manifest(phase))
    compile_model(model, backend="aot_eager")
    engine = pretrain.build_engine(run, phase, model, dist)
    batches = iter(ShardLoader(pretrain.build_loader(run, phase, dist)))
    try:
        for step in range(4):
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                sums = pretrain.train_step(engine, batches)
            assert torch.isfinite(sums).all()
    finally:
        engine.destroy()
    assert counters["stats"]["unique_graphs"] == 1
