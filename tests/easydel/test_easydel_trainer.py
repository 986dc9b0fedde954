"""EasyDeL's SFTTrainer trains tiny Llama and Qwen3 models on the multiplication data with
NTL (`ntl_jax.easydel.use(trainer, ...)`), logs `ntl` and `ntl_term` beside its loss,
and resumes from its checkpoint: the resumed run's steps are those of a run that never
stopped."""

import pytest

pytest.importorskip("easydel")

import easydel as ed  # noqa: E402
import numpy as np  # noqa: E402
from datasets import Dataset  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import easydel as ntl_easydel  # noqa: E402
from ntl_jax.data import multiplication  # noqa: E402
from tests.easydel import tiny  # noqa: E402


def _dataset():
    return Dataset.from_dict({"text": [f"{q} {a}" for q, a in multiplication.examples("train", 48, seed=0)]})


def _trainer(model, directory, steps: int, resume: bool = False):
    arguments = ed.SFTConfig(max_length=32, total_batch_size=8, max_training_steps=steps, save_directory=str(directory),
                             save_steps=2, use_wandb=False, dataset_text_field="text", learning_rate=1e-3,
                             log_steps=1, report_steps=1, packing=False, num_train_epochs=1, model_name="tiny",
                             progress_bar_type="json", resume_if_possible=resume, shuffle_train_dataset=False)
    return ed.SFTTrainer(arguments=arguments, processing_class=tiny.tokenizer(), model=model,
                         train_dataset=_dataset())


def _logged(trainer) -> list:
    """Records each train step's state step, loss and metrics as the trainer logs them."""
    seen, stock = [], trainer._execute_train_step

    def step(state, batch, *args):
        result = stock(state, batch, *args)
        seen.append((int(result[0].step), float(result[1].loss),
                     {k: float(v) for k, v in result[1].other_metrics.items() if k.startswith(("ntl", "cross"))}))
        return result

    trainer._execute_train_step = step
    return seen


@pytest.mark.parametrize("name", sorted(tiny.MODELS))
def test_sft_trains_with_ntl_logs_it_and_resumes_from_its_checkpoint(name, tmp_path):
    trainer = _trainer(tiny.MODELS[name](), tmp_path / "full", steps=4)
    ntl_easydel.use(trainer, number_loss="was")
    full = _logged(trainer)
    trainer.train()
    assert [s for s, _, _ in full] == [1, 2, 3, 4]
    for _, loss, metrics in full:
        assert metrics["ntl_weight_sum"] > 0 and metrics["ntl"] > 0
        np.testing.assert_allclose(metrics["ntl"], metrics["ntl_sum"] / metrics["ntl_weight_sum"], rtol=1e-6)
        np.testing.assert_allclose(loss, metrics["cross_entropy"] + metrics["ntl_term"], rtol=1e-6)
    assert full[-1][2]["cross_entropy"] < full[0][2]["cross_entropy"]  # it learns

    # Stopped after 2 steps (a checkpoint at step 2), then resumed to 4.
    first = _trainer(tiny.MODELS[name](), tmp_path / "resumed", steps=2)
    ntl_easydel.use(first, number_loss="was")
    first.train()
    resumed = _trainer(tiny.MODELS[name](seed=1), tmp_path / "resumed", steps=4, resume=True)
    ntl_easydel.use(resumed, number_loss="was")
    later = _logged(resumed)
    resumed.train()
    assert [s for s, _, _ in later] == [3, 4]
    for (_, loss, metrics), (_, full_loss, full_metrics) in zip(later, full[2:]):
        np.testing.assert_allclose(loss, full_loss, rtol=2e-5)
        np.testing.assert_allclose(metrics["ntl"], full_metrics["ntl"], rtol=2e-5)


def test_ntl_is_pooled_over_gradient_accumulations_micro_batches(tmp_path):
    # EasyDeL averages each metric over the micro-batches; ntl is their pooled mean.
    arguments = ed.SFTConfig(max_length=32, total_batch_size=8, gradient_accumulation_steps=2, max_training_steps=1,
                             save_directory=str(tmp_path), use_wandb=False, dataset_text_field="text",
                             learning_rate=1e-3, packing=False, num_train_epochs=1, model_name="tiny",
                             progress_bar_type="json", shuffle_train_dataset=False, do_last_save=False)
    trainer = ed.SFTTrainer(arguments=arguments, processing_class=tiny.tokenizer(), model=tiny.llama(),
                            train_dataset=_dataset())
    ntl_easydel.use(trainer, number_loss="was")
    seen = _logged(trainer)
    trainer.train()
    [(_, _, metrics)] = seen
    np.testing.assert_allclose(metrics["ntl"], float(ntl_jax.ntl_mean(metrics["ntl_sum"], metrics["ntl_weight_sum"])),
                               rtol=1e-6)
