"""AlgorithmConfig and the methods' own Configs: defaults, derived defaults and per-field validation."""

import attrs
import pytest

from relax.algorithms import AlgorithmConfig, get_algorithm


def test_documented_defaults():
    c = AlgorithmConfig()
    assert c.n_samples_per_prompt == 8
    assert c.reward_keys == ("reward",)
    assert c.reward_weights == (1.0,)
    assert c.eps_clip == 0.2
    assert c.eps_clip_c is None
    assert (c.gamma, c.lam) == (1.0, 1.0)
    assert c.kl_coef == 0.0
    assert c.use_kl_loss is False and c.kl_loss_coef == 0.0 and c.kl_loss_type == "k1"
    assert c.entropy_coef == 0.0
    assert c.normalize_advantages is False
    assert c.grpo_std_normalization is True
    assert c.loss_aggregation == "token_mean"
    sapo, m2po = get_algorithm("sapo").Config(), get_algorithm("m2po").Config()
    assert (sapo.sapo_tau_pos, sapo.sapo_tau_neg) == (1.0, 1.05)
    assert (m2po.m2po_kl2_budget, m2po.m2po_miniclip_low, m2po.m2po_miniclip_high) == (0.01, 0.3, 0.5)


def test_the_shared_config_holds_no_method_specific_field():
    names = {f.name for f in attrs.fields(AlgorithmConfig)}
    assert not {n for n in names if n.startswith(("gdpo_", "m2po_", "sapo_"))}
    for method, prefix in (("sapo", "sapo_"), ("m2po", "m2po_"), ("gdpo", "gdpo_")):
        own = {f.name for f in attrs.fields(get_algorithm(method).Config)} - names
        assert own and all(n.startswith(prefix) for n in own), (method, own)
        assert issubclass(get_algorithm(method).Config, AlgorithmConfig)


def test_eps_clip_high_defaults_to_eps_clip():
    assert AlgorithmConfig().eps_clip_high == 0.2
    assert AlgorithmConfig(eps_clip=0.1).eps_clip_high == 0.1
    assert AlgorithmConfig(eps_clip=0.1, eps_clip_high=0.28).eps_clip_high == 0.28


def test_reward_weights_default_to_one_per_key():
    c = AlgorithmConfig(reward_keys=("correct", "format", "length"))
    assert c.reward_weights == (1.0, 1.0, 1.0)
    assert all(isinstance(w, float) for w in c.reward_weights)


def test_reward_keys_and_weights_are_converted_to_tuples():
    c = AlgorithmConfig(reward_keys=["a", "b"], reward_weights=[1, 2])
    assert c.reward_keys == ("a", "b")
    assert c.reward_weights == (1.0, 2.0)
    # a single key given as a string is one key, not a tuple of characters
    assert AlgorithmConfig(reward_keys="score").reward_keys == ("score",)


def test_config_is_frozen_and_replace_revalidates():
    c = AlgorithmConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.eps_clip = 0.3
    c2 = c.replace(eps_clip=0.3)
    assert c2.eps_clip == 0.3 and c.eps_clip == 0.2
    with pytest.raises(ValueError, match="eps_clip"):
        c.replace(eps_clip=-1.0)


def test_kl_properties():
    assert not AlgorithmConfig().uses_reference
    assert AlgorithmConfig(kl_coef=0.1).kl_in_reward
    c = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.01)
    assert c.kl_in_loss and c.uses_reference and not c.kl_in_reward
    # use_kl_loss with a zero coefficient adds nothing, so no reference model is needed
    assert not AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.0).kl_in_loss


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(reward_keys=("a", "b"), reward_weights=(1.0,)), r"reward_weights has 1 value.*reward_keys has 2"),
        (dict(reward_weights=(float("nan"),)), "reward_weights must be finite"),
        (dict(reward_weights=(float("inf"),)), "reward_weights must be finite"),
        (dict(reward_keys=()), "reward_keys"),
        (dict(n_samples_per_prompt=0), "n_samples_per_prompt"),
        (dict(eps_clip=0.0), "eps_clip"),
        (dict(eps_clip=-0.2), "eps_clip"),
        (dict(eps_clip=float("nan")), "eps_clip"),
        (dict(eps_clip_high=0.0), "eps_clip_high"),
        (dict(eps_clip_c=1.0), "eps_clip_c"),
        (dict(eps_clip_c=0.5), "eps_clip_c"),
        (dict(eps_clip_c=float("inf")), "eps_clip_c"),
        (dict(gamma=1.5), "gamma"),
        (dict(gamma=-0.1), "gamma"),
        (dict(lam=1.01), "lam"),
        (dict(kl_coef=-0.1), "kl_coef"),
        (dict(kl_loss_coef=-0.1), "kl_loss_coef"),
        (dict(kl_loss_type="k4"), "kl_loss_type"),
        (dict(loss_aggregation="sum"), "loss_aggregation"),
        (dict(entropy_coef=float("nan")), "entropy_coef"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlgorithmConfig(**kwargs)


@pytest.mark.parametrize(
    "method, kwargs, match",
    [
        ("sapo", dict(sapo_tau_pos=0.0), "sapo_tau_pos must be > 0, got 0.0"),
        ("sapo", dict(sapo_tau_neg=-1.0), "sapo_tau_neg must be > 0"),
        ("m2po", dict(m2po_kl2_budget=-0.01), "m2po_kl2_budget must be >= 0"),
        ("m2po", dict(m2po_miniclip_low=1.5), r"m2po_miniclip_low must be in \[0, 1\]"),
        ("m2po", dict(m2po_miniclip_high=-0.5), "m2po_miniclip_high"),
        ("gdpo", dict(gdpo_std_eps=0.0), "gdpo_std_eps must be > 0"),
        ("gdpo", dict(gdpo_baseline="median"), "gdpo_baseline must be one of mean, leave_one_out"),
        ("sapo", dict(eps_clip=0.0), "eps_clip"),  # the shared fields' rules hold in a method's Config
    ],
)
def test_a_methods_own_fields_are_checked_by_their_rules(method, kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_algorithm(method).Config(**kwargs)


def test_a_method_takes_its_parents_config_and_refuses_a_foreign_one():
    sapo, m2po = get_algorithm("sapo"), get_algorithm("m2po")
    upgraded = sapo(AlgorithmConfig(eps_clip=0.1)).config  # a plain AlgorithmConfig keeps its values
    assert type(upgraded) is sapo.Config and upgraded.eps_clip == 0.1 and upgraded.sapo_tau_neg == 1.05
    with pytest.raises(TypeError, match="holds m2po_kl2_budget, m2po_miniclip_low, m2po_miniclip_high"):
        sapo(m2po.Config())


@pytest.mark.parametrize("value", [True, 2.0, "8"])
def test_n_samples_per_prompt_must_be_an_int(value):
    with pytest.raises(TypeError, match="n_samples_per_prompt"):
        AlgorithmConfig(n_samples_per_prompt=value)


def test_valid_edge_values_are_accepted():
    c = AlgorithmConfig(gamma=0.0, lam=0.0, eps_clip_c=3.0, kl_loss_type="low_var_kl", n_samples_per_prompt=1)
    assert (c.gamma, c.lam, c.eps_clip_c, c.kl_loss_type) == (0.0, 0.0, 3.0, "low_var_kl")
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        assert AlgorithmConfig(loss_aggregation=mode).loss_aggregation == mode
