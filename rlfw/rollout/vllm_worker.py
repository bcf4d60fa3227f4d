"""Methods rlfw adds to vLLM's workers (`LLM(worker_extension_cls=...)`), called through
`LLM.collective_rpc` by name, so no callable has to be pickled across vLLM's process boundary.

Imported by vLLM inside its worker processes; it imports vLLM only there."""

from __future__ import annotations


class WeightsExtension:
    def rlfw_reload_weights(self, folder: str) -> None:
        """Reload the whole model in place from a `save_pretrained` folder (full fine-tuning).

        vLLM's CPU backend packs each linear layer's weight for its GEMM kernels at load time, and an
        in-place reload re-packs the layers whose weights it loads. A tied LM head loads nothing (the
        checkpoint holds only `embed_tokens`), so it kept its packed copy of the old embedding and
        scored tokens with stale weights (measured here: log-probs up to 0.19 off the trainer's after
        an update of the embedding alone). Re-running the embeddings' post-load processing packs them
        again from the current weights; elsewhere that processing does nothing."""
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        self.model_runner.reload_weights(weights_path=folder)
        for module in self.model_runner.get_model().modules():
            if isinstance(module, VocabParallelEmbedding):
                module.quant_method.process_weights_after_loading(module)
