"""The built-in reference target's data and model: digits rendered to JPEG, a small ResNet.

Submodules, each imported only when used so that `import optlab` stays light:

- `data`: scikit-learn's digits rendered to realistic RGB JPEG payloads, the fixed train/held-out
  split, request streams (fixed or spread sizes, optional Zipf repetition) and the canonical
  decode (`decode_reference`) that the faster preprocess variants are checked against.
- `model`: the classifier (`build_model`) and the shipped weights (`load_trained`); imports torch.
- `train`: `python -m optlab.reference.classifier.train` reproduces the shipped weights.
- `accuracy`: held-out top-1 and agreement for any `predict(payloads) -> labels`.
"""
