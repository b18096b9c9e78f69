// Package deploy holds no code: its tests check the deployment files
// beside it (the systemd unit, the Kubernetes manifests) against the
// programs they run.
package deploy
