#!/usr/bin/env bash
# Layers import downward only. Every `crate::<module>` path in the crate's code (`use crate::...`
# lines, grouped `use crate::{...}` imports and inline `crate::x::y` paths; comments skipped) is
# checked against the layers below, lowest first:
#
#   0  gpu, config, metrics   primitives, settings, the metrics registry
#   1  model, cli             a model and its files; the command line's types
#   2  offload, engine        placement and streaming of weights; generation and batching
#   3  server                 HTTP, which knows only the engine's Backend trait
#   4  runtime                glue that builds the engine and hands it to the server
#
# A file in a layer may import its own layer and the layers of a lower number only (main.rs and
# lib.rs are outside the layers). Usage: scripts/check-layering.sh [SRC_DIR] (default: src).
# Prints every forbidden import as FILE:LINE and exits 1 when there is one.
set -euo pipefail
src="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src}"
[[ -d "$src" ]] || { echo "check-layering: no directory $src" >&2; exit 2; }

if find "$src" -name '*.rs' -print0 | sort -z | xargs -0 perl -e '
use strict;
use warnings;
my %rank = (gpu => 0, config => 0, metrics => 0, model => 1, cli => 1,
            offload => 2, engine => 2, server => 3, runtime => 4);
my ($src, @files) = @ARGV;
$src =~ s{/+$}{};
my $bad = 0;
for my $file (@files) {
    my $rel = substr($file, length($src) + 1);
    # The layer is the first path segment: src/model/spec.rs, src/model.rs and its tests in
    # src/model_tests.rs are all `model`.
    my ($layer) = $rel =~ m{^([a-z_]+?)(?:_tests)?(?:/|\.rs$)};
    next unless defined $layer && exists $rank{$layer};
    open(my $fh, "<", $file) or die "check-layering: $file: $!\n";
    my $code = do { local $/; <$fh> };
    close($fh);
    $code =~ s{//[^\n]*}{}g;    # comments, doc comments included
    # Every imported module with the offset it is named at.
    my @uses;
    while ($code =~ m{\bcrate::(\{(?:[^{}]++|(?1))*\}|[a-z_]+)}g) {
        my ($what, $at) = ($1, $-[1]);
        if ($what !~ /^\{/) {
            push @uses, [$what, $at];
            next;
        }
        # A group: the first segment of each item at depth one.
        my ($depth, $start) = (0, 1);
        for my $i (0 .. length($what) - 1) {
            my $c = substr($what, $i, 1);
            $depth++ if $c eq "{";
            $depth-- if $c eq "}";
            if ($depth == 1 && ($c eq "{" || $c eq ",")) {
                my $rest = substr($what, $i + 1);
                push @uses, [$1, $at + $i + 1 + $-[1]] if $rest =~ /^\s*([a-z_]+)/;
            }
        }
    }
    for my $use (@uses) {
        my ($target, $at) = @$use;
        next if $target eq $layer || !exists $rank{$target};
        next if $rank{$target} < $rank{$layer};
        my $line = 1 + (substr($code, 0, $at) =~ tr/\n//);
        print STDERR "$rel:$line: $layer (layer $rank{$layer}) imports crate::$target",
            " (layer $rank{$target}): layers import downward only\n";
        $bad = 1;
    }
}
exit $bad;
' "$src"; then
  echo "check-layering: every import runs downward"
else
  exit 1
fi
