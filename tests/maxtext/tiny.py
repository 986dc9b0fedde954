"""A tiny MaxText model on the CPU: the command-line settings shared by the tests, the
config, model and a batch with number targets built in-process, and a number loss of
one's own."""

import os

import maxtext
import numpy as np

from tests.objective_options import SQUARED_DISTANCE  # noqa: F401  (the MaxText tests take it from here)

ASSETS = os.path.join(os.path.dirname(maxtext.__file__), "assets", "tokenizers")
CONFIGS = os.path.join(os.path.dirname(maxtext.__file__), "configs")
BASE = os.path.join(CONFIGS, "base.yml")
# Llama-3's tokenizer with its multi-digit number tokens (0-999), so that NTL's table is
# large and MaxText's synthetic data (uniform random tokens) holds number targets.
LLAMA3 = ["tokenizer_type=tiktoken", f"tokenizer_path={os.path.join(ASSETS, 'tokenizer_llama3.tiktoken')}",
          "vocab_size=128256"]
TINY = ["base_emb_dim=64", "base_num_decoder_layers=2", "base_num_query_heads=2", "base_num_kv_heads=2",
        "base_mlp_dim=128", "head_dim=32", "max_target_length=32", "per_device_batch_size=2", "hardware=cpu",
        "skip_jax_distributed_system=true", "enable_checkpointing=false", "dataset_type=synthetic",
        "attention=dot_product", "scan_layers=false", "dtype=float32", *LLAMA3]


def config(*overrides):
    from maxtext.configs import pyconfig

    return pyconfig.initialize([None, BASE, "run_name=test", *TINY, *overrides])


def model(config):
    from maxtext.utils import maxtext_utils, model_creation_utils

    mesh = maxtext_utils.get_mesh_from_config(config)
    return model_creation_utils.get_nnx_create_model_fn(config, mesh)(), mesh


def batch(config, numbers, *, seed=0):
    """Inputs and next-token targets in which about a third of the targets are number
    tokens, and a padded tail (`targets_segmentation` 0) that no loss may read."""
    rng = np.random.default_rng(seed)
    batch_size, length = config.global_batch_size_to_train_on, config.max_target_length
    tokens = rng.integers(0, config.vocab_size, (batch_size, length + 1))
    is_number = rng.random((batch_size, length + 1)) < 0.35
    tokens = np.where(is_number, rng.choice(np.asarray(numbers.ids), tokens.shape), tokens).astype(np.int32)
    segmentation = np.ones((batch_size, length), np.int32)
    segmentation[:, -5:] = 0
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch_size, length))
    return {"inputs": tokens[:, :-1], "inputs_position": positions, "inputs_segmentation": segmentation,
            "targets": tokens[:, 1:], "targets_position": positions, "targets_segmentation": segmentation}


