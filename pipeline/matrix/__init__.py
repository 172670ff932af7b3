"""The matrix: matrix.yaml read and validated into frozen cells (read, model, yamlsrc), the runners, the site
layout and the CI matrix derived from it."""
