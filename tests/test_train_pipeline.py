"""train.pipeline = "sparse_dist": TorchRec's TrainPipelineSparseDist trains exactly like the plain loop
(losses, evaluations in between, parameters, exact resume, two processes), prefetches the pooled tables,
and refuses what it cannot pipeline."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from dist_helpers import TINY, aligned_dataset, assert_same_params, losses, run_train
from opengem.config import ConfigError
from opengem.errors import TrainError
from opengem.train import checkpoint as ckpt
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.pipeline import SparseDistPipeline
from opengem.train.trainer import Trainer, train

FAST = ["train.progress=false", "train.threads=1", "train.warmup_steps=3", "train.log_every=1",
        "data.batch_size=64", "train.eval_every=5", "train.eval_max_batches=1", "train.checkpoint_every=4"]
PIPE = ["train.pipeline=sparse_dist"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_data(load_run_config(TINY).data, tmp_path_factory.mktemp("pipedata"))


@pytest.mark.parametrize("model", ["gem", "dcnv2", "gem@recent"])
def test_pipeline_trains_like_the_plain_loop(tmp_path, data, model, monkeypatch):
    """12 steps with evaluations at 5 and 10 in between: the same loss at every step, the same final
    evaluation and bitwise the same parameters; and the pooled tables really were prefetched."""
    pipelined: list[int] = []
    step = SparseDistPipeline.step

    def counting_step(self, batches):  # noqa: ANN001, ANN202
        more = step(self, batches)
        pipelined.append(len(self._pipeline._pipelined_modules))
        return more

    monkeypatch.setattr(SparseDistPipeline, "step", counting_step)
    name, _, recent = model.partition("@")  # @recent: the model reads each history's last 3 events
    args = [*FAST, "train.steps=12", f"model.name={name}"]
    args += ["model.embedding.seq_recent=3"] if recent else []
    plain = train(load_run_config(TINY, args), tmp_path / "plain", data)
    piped = train(load_run_config(TINY, args + PIPE), tmp_path / "piped", data)
    assert pipelined and min(pipelined) >= 1, pipelined  # the pooled table's lookup came prefetched
    assert losses(tmp_path / "piped") == losses(tmp_path / "plain")
    assert sorted(losses(tmp_path / "plain")) == list(range(1, 13))
    assert piped["final_eval"] == plain["final_eval"]
    evals = [r for r in (tmp_path / "piped" / "metrics.jsonl").read_text().splitlines() if '"eval"' in r]
    assert len(evals) >= 3  # steps 5 and 10 and the final one ran between pipelined steps
    assert_same_params(tmp_path / "plain", tmp_path / "piped")


def test_pipeline_resume_is_exact(tmp_path, data):
    """8 pipelined steps, then resume to 12 == 12 steps without the pipeline: the checkpoint keeps the
    position of the batch trained, not of the batches the pipeline read ahead."""
    args = [*FAST, "train.final_eval=false", "train.eval_every=0"]
    full = train(load_run_config(TINY, args + ["train.steps=12"]), tmp_path / "full", data)
    train(load_run_config(TINY, args + PIPE + ["train.steps=8"]), tmp_path / "part", data)
    meta = ckpt.read_meta(ckpt.latest_checkpoint(tmp_path / "part"))
    assert meta["step"] == 8
    res = train(load_run_config(TINY, args + PIPE + ["train.steps=12"]), tmp_path / "part", data, resume=True)
    assert res["resumed"]["step"] == 8 and res["steps"] == 12
    assert res["last_loss"] == full["last_loss"]
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    assert_same_params(tmp_path / "full", tmp_path / "part")


@pytest.mark.parametrize("where", ["step", "loop"])
def test_an_error_mid_fit_gives_the_tables_their_forward_back(tmp_path, data, monkeypatch, where):
    """An error inside a pipelined step, or in the loop around it (here: saving the step-4 checkpoint),
    leaves no table on the pipeline's forward: the same Trainer still evaluates with its own lookups."""
    from torchrec.distributed.train_pipeline.runtime_forwards import PipelinedForward

    from opengem.train import distributed
    from opengem.train.pipeline import pipelined_tables

    cfg = load_run_config(TINY, [*FAST, *PIPE, "train.steps=8", "train.eval_every=0"])
    with Trainer(cfg, tmp_path / "run", data) as trainer:
        if where == "step":
            monkeypatch.setenv(distributed.INJECT_ENV, "0:3")  # rank 0 raises after step 3
        else:
            def failing_save(**kwargs):  # noqa: ANN003, ANN202
                raise RuntimeError("injected failure: disk full")
            monkeypatch.setattr(trainer, "save_checkpoint", failing_save)
        with pytest.raises(RuntimeError, match="injected failure"):
            trainer.fit()
        assert trainer.step == (3 if where == "step" else 4)
        tables = pipelined_tables(trainer.model)
        assert tables and not any(isinstance(t.forward, PipelinedForward) for t in tables)
        assert trainer.evaluate(max_batches=1)["rows"] > 0


def test_pipeline_setting_is_checked():
    with pytest.raises(ConfigError, match="train.pipeline"):
        load_run_config(TINY, ["train.pipeline=overlap"]).validate()


def test_pipeline_without_pooled_tables_is_refused():
    with pytest.raises(TrainError, match="no sharded pooled embedding tables"):
        SparseDistPipeline(nn.Linear(2, 2), torch.device("cpu"), lambda b: torch.zeros(()),
                           lambda: None, lambda: None)


def test_pipeline_refuses_batches_in_another_key_order(data):
    """The traced view reads batch.sparse as it comes; a loader whose keys are not in the schema's order
    would feed the tables another layout than the model's own calls, so it is refused, naming the keys."""
    cfg = load_run_config(TINY, [*FAST, "train.steps=2"])
    with Trainer(cfg, None, data) as trainer:
        batch = next(iter(trainer.train_loader()))
        keys = list(batch.sparse.keys())
        assert len(keys) >= 2
        shuffled = dataclasses.replace(batch, sparse=batch.sparse.permute(list(range(len(keys)))[::-1]))
        pipe = SparseDistPipeline(trainer.model, trainer.device, trainer._step_loss, trainer._zero_grad,
                                  trainer._dense_step)
        with pytest.raises(TrainError, match="schema's order"):
            pipe.step(iter([shuffled, shuffled]))
        pipe.reset()


@pytest.mark.slow
def test_two_processes_pipelined_follow_two_processes(tmp_path, data):
    """torchrun, 2 ranks (gloo): the pipelined run starts each next batch's pooled-table all-to-all before
    the forward and still gives the same losses, final evaluation and parameters as the plain loop."""
    aligned = aligned_dataset(data, tmp_path / "aligned", 32)
    args = ["train.steps=20", "train.log_every=1", "train.checkpoint_every=0", "data.batch_size=32",
            "train.eval_every=10", "train.eval_max_batches=1"]
    plain = run_train(2, tmp_path / "plain", aligned, args)
    piped = run_train(2, tmp_path / "piped", aligned, args + PIPE)
    assert piped["world_size"] == 2
    assert losses(tmp_path / "piped") == losses(tmp_path / "plain")
    assert piped["final_eval"] == plain["final_eval"]
    assert_same_params(tmp_path / "plain", tmp_path / "piped")
