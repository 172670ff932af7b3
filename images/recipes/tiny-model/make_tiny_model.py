"""Generate a tiny, random, deterministic Llama model directory for vLLM smoke tests.

Why this exists: CI needs a *real* model that a *real* vLLM server can load and serve
(`vllm serve DIR`, /v1/completions, /v1/chat/completions) without downloading weights
from the Hugging Face Hub. This script builds one fully offline at image build time:
a 2-layer LlamaForCausalLM with seeded random weights plus a byte-level BPE tokenizer
trained on the English text embedded below. Its output is gibberish by design; only
the serving path is under test. Two runs with the same package versions produce
byte-identical files.

Usage: python make_tiny_model.py OUTPUT_DIR
"""

from __future__ import annotations

import os

# Never touch the network; must be set before transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json
import sys
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 2048
MAX_LEN = 512
UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"  # token ids 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the porch.
A small model is still a model: it has weights, a tokenizer, and a configuration file.
Containers package software together with everything it needs to run anywhere.
Every morning the baker opens the shop, lights the oven, and kneads fresh bread.
The river winds through the valley, past quiet villages and old stone bridges.
Engineers write tests so that tomorrow's changes do not break yesterday's features.
She packed a notebook, two pencils, a warm jacket, and an apple for the journey.
Servers answer requests; clients send them, wait patiently, and read the replies.
When the storm arrived, the sailors lowered the sails and tied down the cargo.
Numbers like 0, 1, 2, 3, 42, 128, 256, 1024 and 65536 appear in many programs.
The library was silent except for the turning of pages and a distant clock.
Good documentation explains why something exists, not only what it does.
In autumn the leaves turn yellow, orange, and red before they fall to the ground.
He asked a simple question and received a long, thoughtful, surprising answer.
Reproducible builds produce identical bytes from identical inputs every time.
The cat slept on the windowsill, dreaming of birds, fish, and warm sunlight.
Mountains rise above the clouds where the air is thin, cold, and very clear.
A chef tastes the soup, adds a pinch of salt, and stirs it slowly once more.
Trains leave the station on time, carrying commuters, students, and travelers.
Please summarize the following paragraph in one short and friendly sentence.
What is the capital of France? Paris is the capital and largest city of France.
How many legs does a spider have? A spider has eight legs and two body parts.
Translate this sentence into French, Spanish, German, Italian, and Portuguese.
Hello! How are you today? I am fine, thank you. Can I help you with anything?
The committee will meet on Tuesday to discuss the budget, the schedule, and risks.
Children played football in the park until the streetlights flickered on.
Scientists measure temperature, pressure, humidity, and wind speed every hour.
The museum displays paintings, sculptures, ancient coins, and handwritten letters.
Version numbers help everyone know exactly which release they are running.
A gentle breeze carried the smell of pine trees and wildflowers across the meadow.
The pilot checked the instruments, greeted the passengers, and prepared for takeoff.
Water boils at one hundred degrees Celsius at sea level under normal pressure.
Our garden grows tomatoes, cucumbers, peppers, beans, carrots, and sweet herbs.
The detective examined the footprints, the broken window, and the missing key.
Learning a language takes practice, patience, curiosity, and a sense of humor.
Bright stars shine over the desert, and the night sky feels enormous and calm.
The orchestra tuned their violins, cellos, flutes, trumpets, and drums together.
Keep your secrets safe, rotate your keys often, and never log passwords.
The hospital nurses worked through the night, caring for every single patient.
A lighthouse guides ships safely past the rocks along the dangerous northern coast.
Grandmother told stories about her childhood, the war, and the long winters.
Software versions are pinned so that images rebuild the same way next year.
The market sells lemons, oranges, bananas, grapes, cherries, plums, and melons.
Students solved equations, drew diagrams, and wrote essays about history.
The bridge was built of steel and concrete, designed to last for a century.
Could you please explain the difference between a process and a thread?
A process owns memory and resources, while threads share them inside one process.
Birds migrate south for the winter, flying thousands of kilometers each year.
The old typewriter clicked and rang as the writer finished another chapter.
Quietly, carefully, and without any hurry, the gardener pruned the roses.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, and Sunday make a week.
January, February, March, April, May, June, July, August, September, October.
Red, green, blue, yellow, purple, black, white, brown, pink, and gray are colors.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.
The assistant answered politely, briefly, and accurately, then waited for more.
Tokenizers split text into pieces called tokens, which models turn into numbers.
Attention lets each token look at the other tokens that came before it.
Weights are stored in files, loaded into memory, and multiplied very quickly.
A healthy breakfast includes fruit, whole grains, yogurt, eggs, and coffee or tea.
The village festival featured music, dancing, lanterns, and delicious food.
Firefighters rushed toward the burning building while everyone else ran away.
The map showed forests, lakes, roads, railways, borders, and tiny hidden paths.
Her laptop battery died just before she could save the important document.
Rain tapped against the roof all night, and the morning smelled of wet earth.
Deterministic seeds make random numbers repeat exactly the same way each run.
The teacher smiled, closed the book, and said that class was finished for today.
"""


def write_json(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer(out: Path) -> None:
    """Train a byte-level BPE tokenizer with exactly VOCAB_SIZE entries and save it."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[UNK, BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The upper-cased copy adds enough distinct words to fill all VOCAB_SIZE slots.
    lines = CORPUS.splitlines()
    tok.train_from_iterator(lines + [line.upper() for line in lines], trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    tok.post_processor = processors.TemplateProcessing(  # prepend <s> like Llama does
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    tok.save(str(out / "tokenizer.json"))

    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    write_json(out / "special_tokens_map.json", special)
    write_json(
        out / "tokenizer_config.json",
        {
            **special,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": MAX_LEN,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )


def write_model(out: Path, bos_id: int, eos_id: int, pad_id: int) -> int:
    """Save a seeded random bf16 LlamaForCausalLM; return its parameter count."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=MAX_LEN,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {Path(sys.argv[0]).name} OUTPUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    vocab = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = [vocab.token_to_id(t) for t in (BOS, EOS, PAD)]
    n_params = write_model(out, *ids)
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors comes out 0600; vLLM may run as another user
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"tiny-llama: {out} ({n_params:,} params) files: {files}")


if __name__ == "__main__":
    main()
