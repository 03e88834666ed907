"""Model: its shape, its forward passes, and models a user already holds in memory (a Hugging Face
model + tokenizer, or a transformer-lens bridge), which must scan exactly like their saved
folder."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines.registry import resolve_engine
from headscope.models.attention import StopForward
from headscope.models.model import _state_sha256
from tests.tiny_models import tiny_gpt2_in_memory


def test_shape_of_tiny_models(tiny_gpt2, tiny_bert):
    cfg = tiny_gpt2.hf.config
    assert (tiny_gpt2.n_layers, tiny_gpt2.n_heads, tiny_gpt2.n_kv_heads) == (
        cfg.n_layer,
        cfg.n_head,
        cfg.n_head,
    )
    assert (tiny_gpt2.d_model, tiny_gpt2.d_head, tiny_gpt2.n_ctx) == (32, 8, 128)
    assert tiny_gpt2.causal and not tiny_bert.causal
    assert tiny_gpt2.attention_interface and tiny_bert.attention_interface
    # tied embedding/unembedding counted once
    unique = {p.data_ptr(): p.numel() for p in tiny_gpt2.hf.parameters()}
    assert (
        tiny_gpt2.n_params
        == sum(unique.values())
        < sum(p.numel() for p in tiny_gpt2.hf.state_dict().values())
    )


@pytest.mark.real
def test_shape_of_smollm2(smollm2):
    assert (smollm2.n_layers, smollm2.n_heads, smollm2.n_kv_heads, smollm2.d_head) == (30, 9, 3, 64)
    assert 134e6 < smollm2.n_params < 136e6


def test_run_gives_the_models_own_logits_and_hidden_states(tiny_gpt2):
    tokens = torch.tensor([[0, 5, 6, 7], [0, 9, 10, 11]])
    with torch.no_grad():
        want = tiny_gpt2.hf(input_ids=tokens).logits
        hidden = tiny_gpt2.hf.base_model(input_ids=tokens).last_hidden_state
    torch.testing.assert_close(tiny_gpt2.run(tokens, output="logits"), want)
    torch.testing.assert_close(tiny_gpt2.logits(tokens), want)
    torch.testing.assert_close(tiny_gpt2.run(tokens, output="hidden"), hidden)
    assert tiny_gpt2.run(tokens) is None
    with pytest.raises(headscope.HeadscopeError, match="Unknown output 'probs'"):
        tiny_gpt2.run(tokens, output="probs")


def test_a_handler_sees_every_layer_and_may_stop_the_forward(tiny_gpt2):
    tokens = torch.tensor([[0, 5, 6, 7]])
    seen = []

    def handler(call):
        seen.append((call.layer, call.shape, call.causal, call.group))
        if call.layer == 0:
            raise StopForward
        return call.output()

    assert tiny_gpt2.run(tokens, handler=handler, output="logits") is None  # stopped: no logits
    assert seen == [(0, (1, 4, 4, 4), True, 1)]
    seen.clear()
    torch.testing.assert_close(
        tiny_gpt2.run(
            tokens, handler=lambda c: (seen.append(c.layer), c.output())[1], output="logits"
        ),
        tiny_gpt2.logits(tokens),
    )
    assert seen == [0, 1]


def test_run_patterns_leaves_no_hook_and_no_pattern_behind(tiny_gpt2):
    bridge = tiny_gpt2.bridge

    def n_hooks():
        return sum(len(hp._forward_hooks) for hp in bridge.hook_dict.values())

    def pattern_like_tensors(shape):
        """Tensors of a pattern's shape held by any attention module (transformer-lens keeps the
        last one in a private field; if it renames it, this still finds it)."""
        found = []
        for blk in bridge.blocks:
            for mod in blk.attn.modules():
                for name, value in vars(mod).items():
                    if torch.is_tensor(value) and tuple(value.shape) == shape:
                        found.append(name)
        return found

    before = n_hooks()
    tokens = torch.tensor([[0, 5, 6, 7, 8], [0, 9, 10, 11, 12]])
    shapes = []
    tiny_gpt2.run_patterns(
        tokens, torch.ones_like(tokens, dtype=torch.bool), lambda la, p: shapes.append(p.shape)
    )
    assert shapes == [torch.Size([2, 4, 5, 5])] * 2
    assert n_hooks() == before and pattern_like_tensors((2, 4, 5, 5)) == []

    def boom(layer, p):  # a failing callback must not leave hooks either
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny_gpt2.run_patterns(tokens, torch.ones_like(tokens, dtype=torch.bool), boom)
    assert n_hooks() == before


def test_run_patterns_stops_after_the_last_wanted_layer(tiny_gpt2):
    seen, fired = [], []
    bridge = tiny_gpt2.bridge
    bridge.blocks[0].hook_mlp_out.add_hook(lambda t, hook: fired.append(hook.name))
    try:
        tiny_gpt2.run_patterns(
            torch.tensor([[0, 5, 6]]),
            torch.ones(1, 3, dtype=torch.bool),
            lambda layer, p: seen.append(layer),
            layers=[0],
        )
    finally:
        bridge.blocks[0].hook_mlp_out.remove_hooks()
    assert seen == [0] and fired == []  # the MLP of the last wanted block never ran
    with pytest.raises(headscope.HeadscopeError, match=r"not in 0\.\.1"):
        tiny_gpt2.run_patterns(
            torch.tensor([[0, 5]]), torch.ones(1, 2, dtype=torch.bool), print, layers=[2]
        )


def test_attention_activations_and_inputs_are_heads_first(tiny_gpt2):
    acts = tiny_gpt2.attention_activations([0, 5, 6, 7], [1])
    assert set(acts) == {1} and {"q", "k", "v", "pattern", "z"} <= set(acts[1])
    assert acts[1]["q"].shape == (4, 4, 8) and acts[1]["pattern"].shape == (4, 4, 4)
    torch.testing.assert_close(acts[1]["pattern"].sum(-1), torch.ones(4, 4))
    inputs = tiny_gpt2.attention_inputs(torch.tensor([[0, 5, 6, 7]]), [0, 1])
    assert {k: tuple(v.shape) for k, v in inputs.items()} == {0: (1, 4, 32), 1: (1, 4, 32)}


# ------------------------------------------------------------------------------ models in memory


def _scores(model, probes, engine):
    return headscope.scan(model, probes, engine=engine).scores


@pytest.fixture(scope="module")
def saved_and_in_memory(tmp_path_factory):
    hf, tok = tiny_gpt2_in_memory()
    folder = tmp_path_factory.mktemp("saved")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return hf, tok, headscope.load_model(str(folder))


def test_an_in_memory_model_scans_like_its_saved_folder(saved_and_in_memory):
    hf, tok, saved = saved_and_in_memory
    before = (_state_sha256(hf), hf.config._attn_implementation, hf.training)
    # a model handed over in training mode is scored in eval mode, and given back as it was
    hf.train()
    model = headscope.load_model(hf, tok, name="my-gpt2")
    assert model.name == "my-gpt2" and model.source.kind == "memory" and model.attention_interface
    assert model.fingerprint() == before[0]
    probes = headscope.default_probes(saved, n_prompts=4, repeat_len=6, seed=1)
    want = _scores(saved, probes, "fused")
    for engine in ("fused", "blocked", "hooks"):
        got = _scores(model, probes, engine)
        assert got["model"].eq("my-gpt2").all()
        assert (got["score"] - want["score"]).abs().max() < (
            1e-12 if engine == "fused" else 1e-5
        ), engine
        assert (
            got["n"].tolist() == want["n"].tolist()
            and got["label"].tolist() == want["label"].tolist()
        )
    assert (_state_sha256(hf), hf.config._attn_implementation) == before[:2] and hf.training
    hf.eval()


def test_a_transformer_lens_bridge_is_scanned_with_the_hooks_engine(saved_and_in_memory):
    _, _, saved = saved_and_in_memory
    model = headscope.load_model(saved.bridge)
    assert not model.attention_interface and resolve_engine(model).name == "hooks"
    with pytest.raises(
        headscope.HeadscopeError, match="The blocked engine cannot run here: .*use --engine hooks"
    ):
        resolve_engine(model, "blocked")
    probes = headscope.default_probes(saved, n_prompts=3, repeat_len=5)
    got, want = _scores(model, probes, "auto"), _scores(saved, probes, "fused")
    assert (got["score"] - want["score"]).abs().max() < 1e-5


def test_what_load_model_refuses(saved_and_in_memory, tiny_gpt2_dir):
    hf, tok, _ = saved_and_in_memory
    with pytest.raises(
        headscope.HeadscopeError,
        match=r"needs its tokenizer: load_model\(model, "
        r"tokenizer\)",
    ):
        headscope.load_model(hf)
    with pytest.raises(headscope.HeadscopeError, match="tokenizer= goes with an in-memory model"):
        headscope.load_model(str(tiny_gpt2_dir), tok)
    with pytest.raises(headscope.HeadscopeError, match="Cannot load a dict"):
        headscope.load_model({"not": "a model"})
    with pytest.raises(headscope.HeadscopeError, match="is in float32, not bfloat16"):
        headscope.load_model(hf, tok, dtype="bfloat16")


def test_state_sha256_follows_the_weights_and_takes_scalars():
    hf, _ = tiny_gpt2_in_memory()
    first = _state_sha256(hf)
    assert _state_sha256(hf) == first and len(first) == 64
    with torch.no_grad():
        hf.transformer.h[0].attn.c_attn.weight[0, 0] += 1
    assert _state_sha256(hf) != first
    hf.register_buffer("temperature", torch.tensor(0.5))  # a 0-dim buffer
    assert len(_state_sha256(hf)) == 64


def test_a_class_transformers_cannot_switch_is_scanned_with_hooks(saved_and_in_memory, monkeypatch):
    """transformers only logs a warning when it cannot switch a model's attention implementation;
    scanning through a seam that never fires would give all-zero scores, so such a model is
    marked as without the interface (auto -> hooks), and a forced switch that fails says so."""
    hf, tok, _ = saved_and_in_memory
    monkeypatch.setattr(type(hf), "_can_set_attn_implementation", lambda self: False, raising=False)
    model = headscope.load_model(hf, tok)
    assert not model.attention_interface and resolve_engine(model).name == "hooks"
    model.attention_interface = True  # pretend: the switch is attempted, refused, and reported
    with pytest.raises(
        headscope.HeadscopeError, match="would not switch this model's attention implementation"
    ):
        model.run(torch.tensor([[0, 5, 6]]), handler=lambda call: call.output())


@pytest.fixture(scope="module")
def tiny_gemma2():
    """A random Gemma 2: its attention soft-caps the logits, which sdpa cannot do."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.tiny_models import _bpe_tokenizer

    tok = _bpe_tokenizer()
    cfg = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        attn_logit_softcapping=2.0,
        query_pre_attn_scalar=8,
        sliding_window=4,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    hf = Gemma2ForCausalLM(cfg).eval()
    hf.set_attn_implementation("eager")
    return hf, tok


def test_the_models_own_attention_is_kept_when_sdpa_cannot_do_it(tiny_gemma2):
    """With headscope's attention function in place, a soft-capped model still computes its own
    attention (its eager function), so logits and interventions stay right; engines that recompute
    softmax(q k^T) refuse it and point to the hooks engine."""
    hf, tok = tiny_gemma2
    tokens = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        want = hf(input_ids=tokens).logits
    model = headscope.load_model(hf, tok)
    torch.testing.assert_close(model.logits(tokens), want)
    seen = []
    torch.testing.assert_close(
        model.run(
            tokens,
            handler=lambda c: (seen.append(sorted(c.extras)), c.output())[1],
            output="logits",
        ),
        want,
    )
    assert seen == [["softcap"], ["softcap"]]
    probe = headscope.default_probes(model, n_prompts=2, repeat_len=3)[0]
    with pytest.raises(
        headscope.HeadscopeError,
        match="uses softcap, which the (fused|blocked) engine does not model; use --engine hooks",
    ):
        headscope.scan(model, [probe], engine="blocked")


def test_an_intervention_that_edits_the_scale_changes_the_output(tiny_gpt2):
    """call.output() computes the call as the interventions left it, not as it came."""
    from dataclasses import replace

    tokens = torch.tensor([[0, 5, 6, 7, 8]])
    got = {}

    class Sharpen:
        def before(self, call):
            return replace(call, scale=call.scale * 3) if call.layer == 0 else call

        def after(self, call, out):
            if call.layer == 0:
                got["out"], got["call"] = out, call
            return out

    tiny_gpt2.run(tokens, interventions=[Sharpen()])
    call = got["call"]
    want = torch.nn.functional.scaled_dot_product_attention(
        call.query, call.key, call.value, is_causal=True, scale=8**-0.5 * 3
    ).transpose(1, 2)
    torch.testing.assert_close(got["out"], want, atol=1e-6, rtol=0)


def test_restricting_every_key_of_a_row_is_refused(tiny_gpt2):
    from headscope.models.attention import RestrictKeys

    nothing = RestrictKeys(
        layer=0, heads=[0], keep=lambda call: torch.zeros(call.shape[-2:], dtype=torch.bool)
    )
    with pytest.raises(headscope.HeadscopeError, match="leaves a query with no key"):
        tiny_gpt2.run(torch.tensor([[0, 5, 6]]), interventions=[nothing])
