package jobspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rdzv/rdzv/wire"
)

// job.yaml is decoded by sigs.k8s.io/yaml, through JSON, whose errors speak
// of JSON and Go types and carry no position. Before that, checkYAML walks
// the file's yaml.v3 node tree against Spec's fields and reports every
// unknown field (with the nearest known name) and every value of the wrong
// kind in YAML's own terms, each at its line and column; it also records
// where each field is, so that Validate can place its own errors in the
// file. go.yaml.in/yaml/v3 is the yaml.v3 that sigs.k8s.io/yaml itself
// builds on, so the two read the same YAML the same way.

// position is where a field's value starts in the job file.
type position struct{ line, column int }

var (
	durationType  = reflect.TypeOf(wire.Duration{})
	nodeRangeType = reflect.TypeOf(NodeRange{})
	nodeRangeText = regexp.MustCompile(`^\s*(\d+)\s*-\s*(\d+)\s*$`)
)

// checkYAML returns the field errors found in data and where each field it
// saw is, by the field paths Validate uses (nodes.min, command[0],
// env.NAME). A document yaml.v3 cannot read is returned as an error.
func checkYAML(data []byte) (map[string]position, []*wire.FieldError, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, err
	}
	c := &yamlChecker{pos: map[string]position{}}
	if len(doc.Content) > 0 {
		c.check(doc.Content[0], reflect.TypeOf(Spec{}), "")
	}
	return c.pos, c.errs, nil
}

type yamlChecker struct {
	pos  map[string]position
	errs []*wire.FieldError
}

func (c *yamlChecker) fail(n *yaml.Node, field, reason string) {
	c.errs = append(c.errs, &wire.FieldError{Field: field, Reason: reason, Line: n.Line, Column: n.Column})
}

// expected reports that n is not what field takes.
func (c *yamlChecker) expected(n *yaml.Node, field, what string) {
	c.fail(n, field, fmt.Sprintf("expected %s, got %s", what, describe(n)))
}

func (c *yamlChecker) check(n *yaml.Node, t reflect.Type, field string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if field != "" {
		c.pos[field] = position{n.Line, n.Column}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // left out: the default applies
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			c.expected(n, field, "a duration like 30s, 5m or 1h30m")
		} else if _, err := time.ParseDuration(n.Value); err != nil {
			c.expected(n, field, "a duration like 30s, 5m or 1h30m (units ns, us, ms, s, m, h)")
		}
	case t == nodeRangeType:
		switch {
		case n.Kind == yaml.MappingNode:
			c.checkStruct(n, t, field)
		case n.Kind == yaml.ScalarNode && n.Tag == "!!int":
		case n.Kind == yaml.ScalarNode && n.Tag == "!!str" && nodeRangeText.MatchString(n.Value):
		default:
			c.expected(n, field, "a number or a range like 2-4 (or {min: 2, max: 4})")
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.expected(n, field, "a mapping of "+strings.Join(fieldNames(t), ", "))
			return
		}
		c.checkStruct(n, t, field)
	case t.Kind() == reflect.Int:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			c.expected(n, field, "a whole number")
		}
	case t.Kind() == reflect.String:
		// sigs.k8s.io/yaml takes any scalar for a string (name: 123).
		if n.Kind != yaml.ScalarNode {
			c.expected(n, field, "text")
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.expected(n, field, "a list like [a, b]")
			return
		}
		for i, e := range n.Content {
			c.check(e, t.Elem(), fmt.Sprintf("%s[%d]", field, i))
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			c.expected(n, field, "a mapping like {KEY: value}")
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				c.expected(k, field, "text keys")
				continue
			}
			c.check(v, t.Elem(), field+"."+k.Value)
		}
	}
}

func (c *yamlChecker) checkStruct(n *yaml.Node, t reflect.Type, field string) {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		path := k.Value
		if field != "" {
			path = field + "." + k.Value
		}
		if first, dup := seen[k.Value]; dup {
			c.fail(k, path, fmt.Sprintf("is given twice (first at line %d, column %d)", first.Line, first.Column))
			continue
		}
		seen[k.Value] = k
		f, ok := fieldByName(t, k.Value)
		if !ok {
			reason := "unknown field"
			if s := suggest(k.Value, fieldNames(t)); s != "" {
				reason += "; did you mean " + s + "?"
			} else {
				reason += "; known fields here: " + strings.Join(fieldNames(t), ", ")
			}
			c.fail(k, path, reason)
			continue
		}
		c.check(v, f.Type, path)
	}
}

// fieldNames are t's fields as job.yaml spells them.
func fieldNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if name := jsonName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

func fieldByName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); jsonName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func jsonName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// describe says what a node is, as YAML has it.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!int", "!!float":
			return "number " + n.Value
		case "!!bool":
			return "boolean " + n.Value
		case "!!null":
			return "null"
		}
		return "string " + wire.Quote(n.Value)
	}
	return "an alias"
}

// suggest is the known name nearest to name, if it is near enough to be a
// typo: at most a third of its letters wrong, and at least one right.
func suggest(name string, known []string) string {
	best, bestDist := "", len(name)/3+1
	for _, k := range known {
		if d := editDistance(strings.ToLower(name), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, by bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
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
