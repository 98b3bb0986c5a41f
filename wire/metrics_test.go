package wire

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckMetrics(t *testing.T) {
	many := map[string]int{}
	for i := range MaxMetrics + 1 {
		many[fmt.Sprintf("m%d", i)] = i
	}
	tests := []struct {
		name    string
		metrics map[string]int
		want    string
	}{
		{"none", nil, ""},
		{"names as loggers write them", map[string]int{"loss": 1, "train/loss": 2, "lr.group-0": 3, "_x": 4}, ""},
		{"longest name", map[string]int{strings.Repeat("l", MaxMetricNameLength): 1}, ""},
		{"too many", many, "m: at most 16 are allowed, got 17"},
		{"too long", map[string]int{strings.Repeat("l", MaxMetricNameLength+1): 1}, "must be at most 64 characters"},
		{"empty name", map[string]int{"": 1}, `m: name "" must be`},
		{"leading digit", map[string]int{"1loss": 1}, `m: name "1loss" must be`},
		{"space", map[string]int{"a b": 1}, `m: name "a b" must be`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckMetrics("m", tt.metrics)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}
