package clitest

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/cmd/internal/cli"
	"github.com/rdzv/rdzv/wire"
)

// module is the import path the source of the config types is under.
const module = "github.com/rdzv/rdzv/"

// ConfigReference: docs/daemons.md holds the table of the daemon's config
// file made from the code (with -update, it is rewritten to): every
// field, the flag that sets it or "file only", its default and what it
// means (its doc comment, else its flag's help). def is the daemon's
// DefaultConfig, f what read its configuration.
func ConfigReference(t *testing.T, name string, def any, f *cli.File) {
	table := ConfigTable(t, def, f)
	require.NoError(t, cli.CheckDoc(filepath.Join("..", "..", cli.DaemonsDoc), name+" config", table, *update))
}

// ConfigTable is the reference table of a config type's fields.
func ConfigTable(t *testing.T, def any, f *cli.File) string {
	byField := map[string]string{}
	for flag, field := range f.Flags() {
		require.NotContains(t, byField, field, "two flags set %s", field)
		byField[field] = flag
	}
	docs := &docComments{types: map[string]map[string]string{}, read: map[string]bool{}}
	var b strings.Builder
	b.WriteString("| field | flag | default | meaning |\n| --- | --- | --- | --- |\n")
	var undocumented []string
	var rows func(v reflect.Value, prefix string)
	rows = func(v reflect.Value, prefix string) {
		typ := v.Type()
		for i := 0; i < typ.NumField(); i++ {
			sf := typ.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if sf.Anonymous && name == "" {
				rows(v.Field(i), prefix)
				continue
			}
			if !sf.IsExported() || name == "" || name == "-" {
				continue
			}
			field := prefix + name
			fv := v.Field(i)
			if _, flagged := byField[field]; section(sf.Type) && !flagged {
				rows(fv, field+".")
				continue
			}
			flag, meaning := "file only", docs.of(t, typ, sf.Name)
			if fl, ok := byField[field]; ok {
				flag = "`--" + fl + "`"
				if meaning == "" {
					meaning = f.Usage(fl)
				}
				delete(byField, field)
			}
			if meaning == "" {
				undocumented = append(undocumented, fmt.Sprintf("%s (%s.%s)", field, typ, sf.Name))
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", field, flag, defaultOf(fv), cell(meaning))
		}
	}
	rows(reflect.ValueOf(def), "")
	require.Empty(t, undocumented, "fields with neither a doc comment nor a flag: say what each means in its type")
	// A flag whose field is a section, or none in the file.
	for field, flag := range byField {
		require.Failf(t, "flag without a field", "--%s sets %s, which is not a field of the config file", flag, field)
	}
	return b.String()
}

// section is a struct type documented field by field, rather than a value.
func section(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeOf(wire.Duration{}) &&
		!reflect.PointerTo(t).Implements(reflect.TypeOf((*json.Unmarshaler)(nil)).Elem())
}

// defaultOf is a default as the YAML file would write it.
func defaultOf(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String, reflect.Slice, reflect.Map, reflect.Struct:
		if v.IsZero() {
			return "" // none
		}
	}
	if d, ok := v.Interface().(wire.Duration); ok {
		return "`" + d.String() + "`"
	}
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return "`" + fmt.Sprint(v.Interface()) + "`"
	}
	s := string(b)
	if v.Kind() == reflect.String {
		s = v.String()
	}
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

// cell is text on one line of a Markdown table.
func cell(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", `\|`)
}

// docComments are the doc comments of struct fields, read from the source
// of the config types' packages: by package path and type name, then by
// field.
type docComments struct {
	types map[string]map[string]string
	read  map[string]bool
}

// of is the first paragraph of the doc comment of t's field.
func (d *docComments) of(tb testing.TB, t reflect.Type, field string) string {
	if !d.read[t.PkgPath()] {
		d.parse(tb, t.PkgPath())
	}
	return d.types[t.PkgPath()+"."+t.Name()][field]
}

// parse reads the package at pkgPath for its struct types' field comments.
func (d *docComments) parse(tb testing.TB, pkgPath string) {
	d.read[pkgPath] = true
	dir := filepath.Join("..", "..", strings.TrimPrefix(pkgPath, module))
	entries, err := os.ReadDir(dir)
	require.NoError(tb, err)
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		require.NoError(tb, err)
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			fields := map[string]string{}
			prev := ""
			for _, fl := range st.Fields.List {
				text := fl.Doc.Text()
				if text == "" {
					text = fl.Comment.Text()
				}
				// "CertFile and KeyFile ..." above CertFile is KeyFile's too.
				if text == "" && len(fl.Names) == 1 && strings.Contains(prev, fl.Names[0].Name) {
					text = prev
				}
				prev = text
				para, _, _ := strings.Cut(strings.TrimSpace(text), "\n\n")
				for _, n := range fl.Names {
					fields[n.Name] = para
				}
			}
			d.types[pkgPath+"."+ts.Name.Name] = fields
			return true
		})
	}
}
