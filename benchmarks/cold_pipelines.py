"""The pipelines issue 66 found cold, written as users of transformers, sentence-transformers
and Pillow write them.

No model hub is reachable here, so each model is its architecture at full size (the layout of
the checkpoint the issue used, seeded random weights): what a request computes, and so the
latency a cold start is measured against, is the checkpoint's. Each function returns the
pipeline and distinct inputs for its requests.
"""

from __future__ import annotations

import io
import tempfile

import numpy as np

from builder import ModelOp, pipe, vectorized
from pipelines.image_classification import example_image

WORDS = ("the a quick brown fox jumps over lazy dog served model replica scales up under load "
         "first request warm cold start image text query answer").split()
SENTENCE_TOKENS = 32
"""A fixed padded length, as the issue's BERT sentence embedding was built."""


def _decoded(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def _pixels(processor):
    """The pipeline's preprocessing: Pillow-decoded bytes through an image processor, one row."""
    def pixels(data: bytes):
        return processor(images=_decoded(data), return_tensors="np")["pixel_values"][0]

    return pixels


def vit_with_its_image_processor(count: int) -> tuple:
    """transformers' own ``ViTImageProcessor`` (its lazy imports are the first request's) in
    front of a raw ``ViTModel`` (small) giving ``pooler_output`` by name."""
    import torch
    import transformers

    pixels = _pixels(transformers.ViTImageProcessor(size={"height": 32, "width": 32}))
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        image_size=32, patch_size=8))

    encoder = ModelOp(vit, example_inputs=pixels(example_image(0)), name="vit")
    pipeline = (pipe.input("image").map("image", "pixels", pixels)
                .map("pixels", "pooler_output", encoder).output("pooler_output")
                .with_example(example_image(0)))
    return pipeline, [example_image(seed) for seed in range(1, count + 1)]


def vit_base_hidden_states(count: int) -> tuple:
    """google/vit-base-patch16-224's layout: hidden states ``[197, 768]`` of 224 x 224 pixels."""
    import torch
    import transformers

    pixels = _pixels(transformers.ViTImageProcessor(size={"height": 224, "width": 224}))
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False)

    encoder = ModelOp(vit, example_inputs=pixels(example_image(0)), name="vit_base")
    pipeline = (pipe.input("image").map("image", "pixels", pixels)
                .map("pixels", "last_hidden_state", encoder).output("last_hidden_state")
                .with_example(example_image(0)))
    return pipeline, [example_image(seed) for seed in range(1, count + 1)]


@vectorized
def top_label(logits):
    """The most likely class and its probability, per row."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    best = probabilities.argmax(axis=1)
    return best.astype(np.int64), probabilities[np.arange(len(best)), best]


def resnet18_classifier(count: int) -> tuple:
    """microsoft/resnet-18's layout and its image processor (shortest edge 224, centre crop)
    on Pillow-decoded bytes; a ``@vectorized`` post-processing takes the top label."""
    import torch
    import transformers

    pixels = _pixels(transformers.ConvNextImageProcessor(size={"shortest_edge": 224},
                                                         crop_pct=0.875))
    torch.manual_seed(0)
    resnet = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
        layer_type="basic", num_labels=1000))

    classifier = ModelOp(resnet, example_inputs=pixels(example_image(0)), name="resnet18")
    pipeline = (pipe.input("image").map("image", "pixels", pixels)
                .map("pixels", "logits", classifier)
                .map("logits", ("label", "probability"), top_label)
                .output("label", "probability").with_example(example_image(0)))
    return pipeline, [example_image(seed, 256, 320) for seed in range(1, count + 1)]


def bert_tokenizer():
    """A real ``BertTokenizerFast`` over :data:`WORDS`, built from the vocabulary itself
    (transformers 5 ignores ``vocab_file=``: issue 68)."""
    import transformers

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = transformers.BertTokenizerFast(vocab=dict(zip(words, range(len(words)))))
    assert tokenizer.vocab_size == len(words)
    assert tokenizer.tokenize("quick fox") == ["quick", "fox"]
    return tokenizer


@vectorized
def mean_pool(hidden, mask):
    weights = mask[:, :, None].astype(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def bert_base_sentence_embedding(count: int) -> tuple:
    """bert-base-uncased's layout, texts padded to :data:`SENTENCE_TOKENS`, mean-pooled."""
    import torch
    import transformers

    tokenizer = bert_tokenizer()

    def tokenize(text):
        encoded = tokenizer(text, padding="max_length", max_length=SENTENCE_TOKENS,
                            truncation=True, return_tensors="np")
        return encoded["input_ids"][0], encoded["attention_mask"][0]

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False)
    encoder = ModelOp(bert, example_inputs=tokenize("the quick brown fox"), name="bert_base")
    pipeline = (pipe.input("text").map("text", ("input_ids", "attention_mask"), tokenize)
                .map(("input_ids", "attention_mask"), "last_hidden_state", encoder)
                .map(("last_hidden_state", "attention_mask"), "embedding", mean_pool)
                .output("embedding").with_example("the quick brown fox"))
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 20))))
             for _ in range(count)]
    return pipeline, texts


@vectorized
def cosine(image_embeds, text_embeds):
    """CLIP's score: the cosine of the two projections, per row (never across rows)."""
    image = image_embeds / np.linalg.norm(image_embeds, axis=1, keepdims=True)
    text = text_embeds / np.linalg.norm(text_embeds, axis=1, keepdims=True)
    return (image * text).sum(axis=1)


def clip_image_text_score(count: int) -> tuple:
    """openai/clip-vit-base-patch32's layout as two model operators (CLIP's vision and text
    towers with their projections: ``logits_per_image`` would mix the rows of a batch), its
    image processor on Pillow-decoded bytes, texts padded to :data:`SENTENCE_TOKENS`."""
    import torch
    import transformers

    pixels = _pixels(transformers.CLIPImageProcessor())
    tokenizer = bert_tokenizer()
    torch.manual_seed(0)
    vision = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig())
    text_tower = transformers.CLIPTextModelWithProjection(transformers.CLIPTextConfig(
        eos_token_id=tokenizer.sep_token_id))

    def tokenize(text):
        encoded = tokenizer(text, padding="max_length", max_length=SENTENCE_TOKENS,
                            truncation=True, return_tensors="np")
        return encoded["input_ids"][0], encoded["attention_mask"][0]

    image_encoder = ModelOp(vision, example_inputs=pixels(example_image(0)), name="clip_vision")
    text_encoder = ModelOp(text_tower, example_inputs=tokenize("a photo"), name="clip_text")
    pipeline = (pipe.input("image", "text").map("image", "pixels", pixels)
                .map("pixels", "image_embeds", image_encoder)
                .map("text", ("input_ids", "attention_mask"), tokenize)
                .map(("input_ids", "attention_mask"), "text_embeds", text_encoder)
                .map(("image_embeds", "text_embeds"), "score", cosine)
                .output("score").with_example(example_image(0), "a photo of a fox"))
    rng = np.random.default_rng(1)
    calls = [(example_image(seed), " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))))
             for seed in range(1, count + 1)]
    return pipeline, calls


_SAVED = tempfile.TemporaryDirectory(prefix="cold-pipelines-")
"""Where the checkpoints a user would have on disk are saved (removed with the process)."""


def sentence_transformers_encode(count: int) -> tuple:
    """sentence-transformers as its users call it: ``SentenceTransformer(local_dir)`` loaded
    once, its ``encode`` inside a plain function. The checkpoint is all-MiniLM-L6-v2's layout
    (BERT, 6 layers of 384, mean pooling, normalized), saved and loaded as a local directory."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models

    checkpoint = f"{_SAVED.name}/minilm"
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=len(WORDS) + 5, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536), add_pooling_layer=False).save_pretrained(checkpoint)
    bert_tokenizer().save_pretrained(checkpoint)
    encoder = models.Transformer(checkpoint, max_seq_length=128)
    pooling = models.Pooling(encoder.get_embedding_dimension(), "mean")
    SentenceTransformer(modules=[encoder, pooling, models.Normalize()]).save(f"{checkpoint}-st")
    model = SentenceTransformer(f"{checkpoint}-st", device="cpu")

    def embed(text: str):
        return model.encode(text)

    pipeline = (pipe.input("text").map("text", "embedding", embed).output("embedding")
                .with_example("the quick brown fox"))
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 24)))) for _ in range(count)]
    return pipeline, texts


TROCR_NEW_TOKENS = 12


def trocr_generate(count: int) -> tuple:
    """A TrOCR-style ``VisionEncoderDecoderModel.generate()`` inside a plain function (greedy),
    on transformers' image processor over Pillow-decoded bytes: trocr-small's layout (a
    DeiT-small encoder at 384 x 384, a 6-layer decoder of 256)."""
    import torch
    import transformers

    processor = transformers.ViTImageProcessor(size={"height": 384, "width": 384})
    torch.manual_seed(0)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        transformers.ViTConfig(image_size=384, patch_size=16, hidden_size=384,
                               num_hidden_layers=12, num_attention_heads=6,
                               intermediate_size=1536),
        transformers.TrOCRConfig(vocab_size=1024, d_model=256, decoder_layers=6,
                                 decoder_attention_heads=8, decoder_ffn_dim=1024,
                                 cross_attention_hidden_size=384, decoder_start_token_id=0,
                                 pad_token_id=1, eos_token_id=2, bos_token_id=0,
                                 init_std=1.0))
    model = transformers.VisionEncoderDecoderModel(config=config).eval()
    model.generation_config.decoder_start_token_id = 0
    model.generation_config.pad_token_id = 1

    def read(data: bytes):
        pixels = processor(images=_decoded(data), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            tokens = model.generate(pixels, max_new_tokens=TROCR_NEW_TOKENS, do_sample=False,
                                    num_beams=1)
        return tokens[0].numpy()

    pipeline = (pipe.input("image").map("image", "tokens", read).output("tokens")
                .with_example(example_image(0)))
    return pipeline, [example_image(seed) for seed in range(1, count + 1)]


PIPELINES = {
    "vit_image_processor": vit_with_its_image_processor,
    "vit_base_hidden_states": vit_base_hidden_states,
    "resnet18_classifier": resnet18_classifier,
    "bert_base_sentence": bert_base_sentence_embedding,
    "clip_image_text": clip_image_text_score,
    "sentence_transformers": sentence_transformers_encode,
    "trocr_generate": trocr_generate,
}
"""Name → the function that builds it, given how many distinct inputs are wanted."""
