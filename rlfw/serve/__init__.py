"""Serving trained policies: Ray Serve LLM's OpenAI-compatible app from an rlfw config.

- `python -m rlfw.serve`: the base model and its adapters behind one endpoint (`rlfw.serve.__main__`);
- `python -m rlfw.serve.export`: an adapter in the layout the server loads (`rlfw.serve.adapters`);
- `rlfw.serve.ingress`: the checks in front of Ray's ingress (API key, adapter names, images);
- `rlfw.serve.app`: the application, a Serve config file and a KubeRay RayService from one config.

Runs in the vLLM environment (`bash scripts/setup.sh --vllm`); nothing here is imported by training.
"""
