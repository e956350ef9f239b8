"""The authoring model: workload catalogs and pipeline manifests, loaded, validated, normalised."""
