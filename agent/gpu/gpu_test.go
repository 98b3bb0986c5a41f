package gpu_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/agent/gpu"
)

func TestFakeDiscover(t *testing.T) {
	tests := []struct {
		name    string
		fake    gpu.Fake
		want    []gpu.GPU
		wantErr error
	}{
		{
			name: "none",
			fake: gpu.Fake{Count: 0, Node: "n1"},
			want: []gpu.GPU{},
		},
		{
			name: "two",
			fake: gpu.Fake{Count: 2, Node: "n1"},
			want: []gpu.GPU{
				{Index: 0, UUID: "GPU-fake-n1-0", Name: "Fake GPU"},
				{Index: 1, UUID: "GPU-fake-n1-1", Name: "Fake GPU"},
			},
		},
		{
			name:    "negative",
			fake:    gpu.Fake{Count: -1, Node: "n1"},
			wantErr: gpu.ErrInvalidFakeCount,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d gpu.Discoverer = tt.fake
			got, err := d.Discover(context.Background())
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestFakeUUIDsDifferAcrossNodes(t *testing.T) {
	a, err := gpu.Fake{Count: 1, Node: "a"}.Discover(context.Background())
	require.NoError(t, err)
	b, err := gpu.Fake{Count: 1, Node: "b"}.Discover(context.Background())
	require.NoError(t, err)
	require.NotEqual(t, a[0].UUID, b[0].UUID)
}
