"""Local provisioning: the control plane (kube-apiserver + etcd), containerd + registries, upgrade artifacts."""
