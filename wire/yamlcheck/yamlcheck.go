// Package yamlcheck reports the mistakes in a YAML file decoded into a Go
// struct (job.yaml, the daemons' configs) in YAML's own terms, each at its
// line and column with the field's path, and suggests the nearest known
// name for a misspelt field.
//
// The files are decoded by sigs.k8s.io/yaml, through JSON, whose errors
// speak of JSON and Go types and carry no position. Before that, Check
// walks the file's yaml.v3 node tree against the struct's fields and
// reports every unknown field and every value of the wrong kind; it also
// records where each field is (Positions), so that the errors a Validate
// finds later can be placed in the file too. go.yaml.in/yaml/v3 is the
// yaml.v3 that sigs.k8s.io/yaml itself builds on, so the two read the same
// YAML the same way.
package yamlcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/wire"
)

// Pos is where a field's value starts in the file (from 1).
type Pos struct{ Line, Column int }

// Positions are where the fields of a file are, by the field paths errors
// use: a.b, list[0], map.KEY.
type Positions map[string]Pos

// Locate places fe at its field, or at the nearest enclosing field that is
// in the file (a defaulted nodes.max is at nodes). A field the file does
// not hold leaves fe as it is.
func (p Positions) Locate(fe *wire.FieldError) {
	for field := fe.Field; field != ""; {
		if at, ok := p[field]; ok {
			fe.Line, fe.Column = at.Line, at.Column
			return
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			return
		}
		field = field[:i]
	}
}

// Place returns err with each of its joined errors (errors.Join) that
// is or wraps a *wire.FieldError of a field the file holds prefixed with
// the field's line and column, as Check's errors are; nil stays nil. The
// errors are not changed: a wrapping error's message is fixed when made.
func (p Positions) Place(err error) error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		placed := make([]error, len(errs))
		for i, e := range errs {
			placed[i] = p.Place(e)
		}
		return errors.Join(placed...)
	}
	var fe *wire.FieldError
	if !errors.As(err, &fe) || fe.Line > 0 {
		return err
	}
	at := wire.FieldError{Field: fe.Field}
	if p.Locate(&at); at.Line == 0 {
		return err
	}
	return &placedError{at: at, err: err}
}

// placedError is an error of Validate's placed in the file.
type placedError struct {
	at  wire.FieldError
	err error
}

func (e *placedError) Error() string {
	return fmt.Sprintf("line %d, column %d: %s", e.at.Line, e.at.Column, e.err.Error())
}

func (e *placedError) Unwrap() error { return e.err }

// Placed reports whether Place placed any of err's errors in the file.
func Placed(err error) bool {
	var p *placedError
	return errors.As(err, &p)
}

// Without drops the positions of field and of everything under it: a
// value given elsewhere (a flag) is not where the file has it.
func (p Positions) Without(field string) {
	for f := range p {
		if f == field || strings.HasPrefix(f, field+".") || strings.HasPrefix(f, field+"[") {
			delete(p, f)
		}
	}
}

// TypeCheck checks a value of a type that has YAML forms of its own,
// reporting through c.
type TypeCheck func(c *Checker, n *yaml.Node, t reflect.Type, field string)

var (
	durationType    = reflect.TypeOf(wire.Duration{})
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

// Checker walks a document against a Go type. It is used by one
// goroutine, for one document.
type Checker struct {
	types map[reflect.Type]TypeCheck
	pos   Positions
	errs  []*wire.FieldError
}

// Check returns the field errors found in data against root's type (a
// struct), and where each field it saw is. types checks the types with
// forms of their own (a number or a range); any other type with an
// UnmarshalJSON method is checked by that method. A document yaml.v3
// cannot read is returned as an error.
func Check(data []byte, root reflect.Type, types map[reflect.Type]TypeCheck) (Positions, []*wire.FieldError, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, err
	}
	c := &Checker{types: types, pos: Positions{}}
	if len(doc.Content) > 0 {
		c.Check(doc.Content[0], root, "")
	}
	return c.pos, c.errs, nil
}

// Fail reports that n, at field, is wrong for reason.
func (c *Checker) Fail(n *yaml.Node, field, reason string) {
	c.errs = append(c.errs, &wire.FieldError{Field: field, Reason: reason, Line: n.Line, Column: n.Column})
}

// Expected reports that n is not what field takes.
func (c *Checker) Expected(n *yaml.Node, field, what string) {
	c.Fail(n, field, fmt.Sprintf("expected %s, got %s", what, describe(n)))
}

// Check checks n as a value of type t at field.
func (c *Checker) Check(n *yaml.Node, t reflect.Type, field string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if field != "" {
		c.pos[field] = Pos{n.Line, n.Column}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // left out: the default applies
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if check, ok := c.types[t]; ok {
		check(c, n, t, field)
		return
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			c.Expected(n, field, "a duration like 30s, 5m or 1h30m")
		} else if _, err := time.ParseDuration(n.Value); err != nil {
			c.Expected(n, field, "a duration like 30s, 5m or 1h30m (units ns, us, ms, s, m, h)")
		}
	case reflect.PointerTo(t).Implements(unmarshalerType):
		c.unmarshaler(n, t, field)
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.Expected(n, field, "a mapping of "+strings.Join(FieldNames(t), ", "))
			return
		}
		c.Struct(n, t, field)
	case t.Kind() == reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			c.Expected(n, field, "true or false")
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			c.Expected(n, field, "a whole number")
		}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			c.Expected(n, field, "a number")
		}
	case t.Kind() == reflect.String:
		// sigs.k8s.io/yaml takes any scalar for a string (name: 123).
		if n.Kind != yaml.ScalarNode {
			c.Expected(n, field, "text")
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.Expected(n, field, "a list like [a, b]")
			return
		}
		for i, e := range n.Content {
			c.Check(e, t.Elem(), fmt.Sprintf("%s[%d]", field, i))
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			c.Expected(n, field, "a mapping like {KEY: value}")
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				c.Expected(k, field, "text keys")
				continue
			}
			c.Check(v, t.Elem(), field+"."+k.Value)
		}
	}
}

// unmarshaler checks n by decoding it with t's own UnmarshalJSON, as
// sigs.k8s.io/yaml will, so that its error is placed at n.
func (c *Checker) unmarshaler(n *yaml.Node, t reflect.Type, field string) {
	doc, err := yaml.Marshal(n)
	if err == nil {
		var b []byte
		if b, err = sigsyaml.YAMLToJSON(doc); err == nil {
			err = reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(b)
		}
	}
	if err != nil {
		c.Fail(n, field, err.Error())
	}
}

// Struct checks the mapping n against the fields of the struct type t.
func (c *Checker) Struct(n *yaml.Node, t reflect.Type, field string) {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		path := k.Value
		if field != "" {
			path = field + "." + k.Value
		}
		if first, dup := seen[k.Value]; dup {
			c.Fail(k, path, fmt.Sprintf("is given twice (first at line %d, column %d)", first.Line, first.Column))
			continue
		}
		seen[k.Value] = k
		f, ok := fieldByName(t, k.Value)
		if !ok {
			reason := "unknown field"
			if s := Suggest(k.Value, FieldNames(t)); s != "" {
				reason += "; did you mean " + s + "?"
			} else {
				reason += "; known fields here: " + strings.Join(FieldNames(t), ", ")
			}
			c.Fail(k, path, reason)
			continue
		}
		c.Check(v, f.Type, path)
	}
}

// FieldNames are t's fields as the YAML file spells them (their json
// tags), with those of embedded structs, which JSON inlines.
func FieldNames(t reflect.Type) []string {
	var names []string
	for _, f := range fields(t) {
		names = append(names, jsonName(f))
	}
	return names
}

func fieldByName(t reflect.Type, name string) (reflect.StructField, bool) {
	for _, f := range fields(t) {
		if jsonName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// fields are t's fields that JSON decodes, embedded structs' inlined.
func fields(t reflect.Type) []reflect.StructField {
	var fs []reflect.StructField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" && f.Type.Kind() == reflect.Struct {
			fs = append(fs, fields(f.Type)...)
			continue
		}
		if jsonName(f) != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// jsonName is f's name in the file. Every field a file sets has a json
// tag: encoding/json's fallback to the Go name, matched in any case, is
// not a name to document.
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

// Suggest is the known name nearest to name, if it is near enough to be a
// typo: at most a third of its letters wrong, and at least one right.
func Suggest(name string, known []string) string {
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

// Error lists every problem Check found in a file, so that it is fixed in
// one go rather than one error at a time.
type Error struct {
	Errors []*wire.FieldError
}

// Error is one problem on one line, or each of several on a line of its
// own, each with its line and column.
func (e *Error) Error() string {
	if len(e.Errors) == 1 {
		return e.Errors[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems:", len(e.Errors))
	for _, fe := range e.Errors {
		b.WriteString("\n  " + fe.Error())
	}
	return b.String()
}

// ErrNotYAML marks a file yaml.v3 cannot read at all.
var ErrNotYAML = errors.New("not valid YAML")

// Unmarshal decodes data into v, a pointer to a struct that holds the
// defaults, strictly: every unknown field and value of the wrong kind is
// an *Error, each placed in the file. It returns where each field is.
func Unmarshal(data []byte, v any) (Positions, error) {
	pos, errs, err := Check(data, reflect.TypeOf(v).Elem(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotYAML, err)
	}
	if len(errs) > 0 {
		return nil, &Error{Errors: errs}
	}
	// Check has already refused what this would; an error here is a case
	// it missed, still refused.
	if err := sigsyaml.UnmarshalStrict(data, v); err != nil {
		return nil, err
	}
	return pos, nil
}

// LoadFile reads the YAML file at path over def, which holds the
// defaults, as Unmarshal does; its errors name the file.
func LoadFile[T any](path string, def T) (T, Positions, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return def, nil, fmt.Errorf("reading the config file: %w", err) // an *fs.PathError names path
	}
	pos, err := Unmarshal(data, &def)
	if err != nil {
		return def, nil, fmt.Errorf("%s: %w", path, err)
	}
	return def, pos, nil
}
