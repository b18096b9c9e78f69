// Package deploy holds no code: its tests check the deployment files
// against the programs they run: the systemd units beside it, and the
// Helm chart in ../charts/nftredir (helm lint, the rendered manifests of
// each platform profile as golden files in testdata/, and what the
// daemon and the install step need of them).
package deploy
