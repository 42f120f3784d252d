"""Exports: a scenario or a `sim up` spec as Kubernetes objects (a Kubeflow job and a Chaos Mesh workflow)."""
