"""What the ``vllm`` generator adds to vLLM's worker: vLLM mixes this class into whatever worker
class it runs (``LLM(worker_extension_cls=...)``, its documented hook for RL trainers), and
the trainer calls its methods through ``LLM.collective_rpc``, which runs them on every worker
of the engine. Nothing here imports vLLM."""

from __future__ import annotations

import torch


class TrainedWeights:
    """Loads the trainer's weights into the worker's model. Each tensor is whole; under tensor
    parallelism every worker receives all of them and its model's loaders keep its shard."""

    def load_trained_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Load ``weights`` (Hugging Face names, whole tensors); returns how many."""
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)

    def weights_checksum(self) -> float:
        """The float64 sum of this worker's weights (its shards): to see that a sync took."""
        return float(sum(p.detach().double().sum() for p in self.model_runner.model.parameters()))


#: the dotted name vLLM imports the extension by
EXTENSION = f"{TrainedWeights.__module__}.{TrainedWeights.__qualname__}"
