package controller

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckpointPathOK(t *testing.T) {
	tests := []struct {
		name, dir, path string
		ok              bool
	}{
		{"step dir", "/ckpt", "/ckpt/step-10", true},
		{"nested", "/ckpt", "/ckpt/run/step-10", true},
		{"name starting with dots", "/ckpt", "/ckpt/..step-10", true},
		{"no dir configured", "", "/anywhere/step-10", true},
		{"the dir itself", "/ckpt", "/ckpt", false},
		{"parent", "/ckpt", "/", false},
		{"sibling", "/ckpt", "/ckpt2/step-10", false},
		{"traversal", "/ckpt", "/ckpt/../etc", false},
		{"relative", "/ckpt", "ckpt/step-10", false},
		{"unclean", "/ckpt", "/ckpt//step-10", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkpointPathOK(tt.dir, tt.path)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
		})
	}
}
