#!/usr/bin/env bash
# Checks deploy/'s manifests against Kubernetes' API models and drpc's operational rules
# (deploy/check_manifests.py), then proves with --self_test that the checks can fail.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
check=(/usr/bin/python3 "${root}/deploy/check_manifests.py" --version_file="${root}/VERSION")
"${check[@]}" "${root}/deploy"
"${check[@]}" --self_test "${root}/deploy"
