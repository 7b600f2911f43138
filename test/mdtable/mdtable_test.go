package mdtable

import (
	"slices"
	"testing"
)

func TestCells(t *testing.T) {
	for _, tc := range []struct {
		row  string
		want []string
	}{
		{"| a | b |", []string{"a", "b"}},
		{"  |a|`x | y`|c\\|d|", []string{"a", "`x | y`", "c|d"}},
		{"not a row", nil},
	} {
		if got := Cells(tc.row); !slices.Equal(got, tc.want) {
			t.Errorf("Cells(%q) = %q, want %q", tc.row, got, tc.want)
		}
	}
}
