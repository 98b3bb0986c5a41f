package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// job.yaml is checked by wire/yamlcheck before it is decoded: every
// unknown field (with the nearest known name) and every value of the wrong
// kind is reported in YAML's terms at its line and column, and where each
// field is is kept for Validate's errors. nodes has forms of its own.

var (
	nodeRangeType = reflect.TypeOf(NodeRange{})
	nodeRangeText = regexp.MustCompile(`^\s*(\d+)\s*-\s*(\d+)\s*$`)
	// specTypes are the types of job.yaml with YAML forms of their own.
	specTypes = map[reflect.Type]yamlcheck.TypeCheck{nodeRangeType: checkNodeRange}
)

// checkYAML returns the field errors found in data and where each field it
// saw is, by the field paths Validate uses (nodes.min, command[0],
// env.NAME). A document yaml.v3 cannot read is returned as an error.
func checkYAML(data []byte) (yamlcheck.Positions, []*wire.FieldError, error) {
	return yamlcheck.Check(data, reflect.TypeOf(Spec{}), specTypes)
}

// checkNodeRange takes nodes as a number, a range "2-4" or {min, max}.
func checkNodeRange(c *yamlcheck.Checker, n *yaml.Node, t reflect.Type, field string) {
	switch {
	case n.Kind == yaml.MappingNode:
		c.Struct(n, t, field)
	case n.Kind == yaml.ScalarNode && n.Tag == "!!int":
	case n.Kind == yaml.ScalarNode && n.Tag == "!!str" && nodeRangeText.MatchString(n.Value):
	default:
		c.Expected(n, field, "a number or a range like 2-4 (or {min: 2, max: 4})")
	}
}

// UnmarshalJSON takes nodes as a number (exactly that many), a range
// "2-4", or {min, max}.
func (r *NodeRange) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // left out: Validate says what is missing
	}
	if n, err := strconv.Atoi(string(b)); err == nil {
		*r = NodeRange{Min: n, Max: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		m := nodeRangeText.FindStringSubmatch(s)
		if m == nil {
			return fmt.Errorf("nodes: expected a number or a range like 2-4, got string %s: %w", wire.Quote(s), ErrInvalid)
		}
		lo, _ := strconv.Atoi(m[1])
		hi, _ := strconv.Atoi(m[2])
		*r = NodeRange{Min: lo, Max: hi}
		return nil
	}
	// The plain struct, without this method, as strictly as the rest.
	type plain NodeRange
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode((*plain)(r))
}
