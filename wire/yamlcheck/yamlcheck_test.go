package yamlcheck

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/wire"
)

func TestSuggest(t *testing.T) {
	known := []string{"gpus_per_node", "procs_per_node", "nodes", "name"}
	require.Equal(t, "gpus_per_node", Suggest("gpu_per_node", known))
	require.Equal(t, "gpus_per_node", Suggest("GPUS_PER_NODE", known))
	require.Equal(t, "nodes", Suggest("node", known))
	require.Empty(t, Suggest("selector", known), "nothing near enough")
}

// entry has forms of its own, which its UnmarshalJSON alone knows.
type entry string

func (e *entry) UnmarshalJSON(b []byte) error {
	if string(b) == `"bad"` {
		return errors.New(`want anything but "bad"`)
	}
	*e = entry(b)
	return nil
}

type inner struct {
	Port    int           `json:"port"`
	Enabled bool          `json:"enabled"`
	Ratio   float64       `json:"ratio"`
	Wait    wire.Duration `json:"wait"`
}

type Files struct {
	Cert string `json:"cert"`
}

type config struct {
	Files
	Controller string            `json:"controller"`
	Inner      inner             `json:"inner"`
	Entries    []entry           `json:"entries"`
	Labels     map[string]string `json:"labels"`
	Hidden     string            `json:"-"`
}

func TestUnmarshal(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"misspelt field", "controler: x\n", "line 1, column 1: controler: unknown field; did you mean controller?"},
		{"misspelt nested field", "inner:\n  prt: 1\n", "line 2, column 3: inner.prt: unknown field; did you mean port?"},
		{"nothing near", "zzzzzzzz: 1\n", "line 1, column 1: zzzzzzzz: unknown field; known fields here: cert, controller, inner, entries, labels"},
		{"embedded struct's field", "cert: [a]\n", "line 1, column 7: cert: expected text, got a list"},
		{"duration as a number", "inner: {wait: 5}\n", "line 1, column 15: inner.wait: expected a duration like 30s, 5m or 1h30m, got number 5"},
		{"bool as text", "inner:\n  enabled: yes please\n", `line 2, column 12: inner.enabled: expected true or false, got string "yes please"`},
		{"int as text", "inner: {port: http}\n", `line 1, column 15: inner.port: expected a whole number, got string "http"`},
		{"float as a list", "inner: {ratio: [1]}\n", "line 1, column 16: inner.ratio: expected a number, got a list"},
		{"its own UnmarshalJSON", "entries: [ok, bad]\n", `line 1, column 15: entries[1]: want anything but "bad"`},
		{"section as text", "inner: x\n", `line 1, column 8: inner: expected a mapping of port, enabled, ratio, wait, got string "x"`},
		{"twice", "controller: a\ncontroller: b\n", "line 2, column 1: controller: is given twice (first at line 1, column 1)"},
		{"several", "controler: a\ninner: {wait: 5}\n", "2 problems:\n  line 1, column 1: controler: unknown field; did you mean controller?\n  line 2, column 15: inner.wait: expected a duration"},
		{"not yaml", "controller: [\n", "not valid YAML: yaml: line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg config
			_, err := Unmarshal([]byte(tt.yaml), &cfg)
			require.ErrorContains(t, err, tt.want)
			for _, leak := range []string{"JSON", "json", "Go struct", "yamlcheck."} {
				require.NotContains(t, err.Error(), leak)
			}
		})
	}
}

func TestUnmarshalKeepsDefaultsAndPositions(t *testing.T) {
	cfg := config{Controller: "default", Inner: inner{Port: 7}}
	pos, err := Unmarshal([]byte("inner:\n  enabled: true\nentries: [a]\n"), &cfg)
	require.NoError(t, err)
	require.Equal(t, "default", cfg.Controller)
	require.Equal(t, 7, cfg.Inner.Port)
	require.True(t, cfg.Inner.Enabled)
	require.Equal(t, Pos{2, 12}, pos["inner.enabled"])
	require.Equal(t, Pos{3, 11}, pos["entries[0]"])

	// Validate's errors, however wrapped, are placed at their field or
	// the nearest enclosing one in the file.
	port := &wire.FieldError{Field: "inner.port", Reason: "must be a port"}
	entry := &wire.FieldError{Field: "entries[0]", Reason: "bad entry"}
	missing := &wire.FieldError{Field: "controller", Reason: "is required"}
	err = errors.Join(fmt.Errorf("%w (see the docs)", port), entry, missing, errors.New("other"))
	placed := pos.Place(err)
	require.ErrorIs(t, placed, port)
	require.Equal(t, "line 2, column 3: inner.port: must be a port (see the docs)\nline 3, column 11: entries[0]: bad entry\ncontroller: is required\nother", placed.Error())
	require.NoError(t, pos.Place(nil))

	// A value a flag gave is not in the file.
	pos.Without("inner")
	require.NotContains(t, pos, "inner.enabled")
	require.Contains(t, pos, "entries[0]")
}
