"""Example pipelines; each module exposes ``pipeline``, ready for ``build_pipeline_model``.

* :mod:`pipelines.text_embedding` — text → tokens → transformer encoder → mean pool → vector.
* :mod:`pipelines.image_classification` — PNG/PPM bytes → CNN → top-k labels and scores.
* :mod:`pipelines.text_recognizer` — text-line image → encoder → greedy decoding loop → text.

Models are small and randomly initialised from fixed seeds; their weights are written to disk
once (:mod:`pipelines.weights`) and loaded from there, as a real model's would be.
"""
