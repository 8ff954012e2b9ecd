#!/usr/bin/env bash
# Install the tools that check the k8s/ manifests offline, each in a virtual environment of its own under
# var/tools/ (checkov pins many packages; kept apart, it cannot disturb the project's or the other tool's):
#
#   var/tools/checkov/bin/checkov                           the security scan (framework kubernetes)
#   var/tools/kubernetes-validate/bin/kubernetes-validate   the schema check (ships the Kubernetes schemas)
#
# Does nothing for a tool already installed at its pinned version. kubectl (with its kustomize) is not
# installed here: tests/test_k8s_manifests.py skips, saying so, where it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"

install_tool() {  # install_tool <venv name> <package> <version> <command>
  local venv="var/tools/$1" package="$2" version="$3" command="$4"
  if [ -x "$venv/bin/$command" ] && [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$package'))" 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  echo "installing $package $version into $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$package==$version"
  test -x "$venv/bin/$command" || { echo "$package installed no $venv/bin/$command" >&2; exit 1; }
}

install_tool checkov checkov "$CHECKOV_VERSION" checkov
install_tool kubernetes-validate kubernetes-validate "$KUBERNETES_VALIDATE_VERSION" kubernetes-validate
