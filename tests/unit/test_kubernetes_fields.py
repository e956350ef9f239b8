"""dpone.authoring.kubernetes_fields: unknown keys anywhere in a manifest-form structure."""

from __future__ import annotations

from dpone.authoring.kubernetes_fields import unknown_keys


def test_nested_keys_are_walked_through_lists_and_maps() -> None:
    volumes = [
        {"name": "a", "secret": {"secretName": "s", "items": [{"key": "k", "path": "p"}]}},
        {"name": "b", "projected": {"sources": [{"secret": {"name": "s", "itms": []}}]}},
        {"name": "c", "csi": {"driver": "d", "volumeAttributes": {"anyKey": "v"}}},
        {"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClass": "x"}}}},
    ]
    found = [(path, key) for path, key, _ in unknown_keys(volumes, "list[V1Volume]")]
    assert found == [
        ((1, "projected", "sources", 0, "secret"), "itms"),
        ((3, "ephemeral", "volumeClaimTemplate", "spec"), "storageClass"),
    ]


def test_free_form_values_and_other_shapes_are_left_alone() -> None:
    labels = {"matchLabels": {"any/key": "v"}, "matchExpressions": "not a list"}
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": labels, "topologyKey": "zone"}
    ]}}  # fmt: skip
    assert list(unknown_keys(affinity, "V1Affinity")) == []
    assert list(unknown_keys("text", "V1Affinity")) == []
