# Shell helpers the benchmark scripts source: reading RESULT lines and dividing their figures.
# kv LINE KEY: the value of KEY=VALUE in a RESULT line ("RESULT tokens_per_s=123 mfu=45 ..."), empty when absent
kv() { tr ' ' '\n' <<< "$1" | grep "^$2=" | head -n 1 | cut -d= -f2; }
# ratio_of A B: A / B to three decimals, "-" when either is missing or not positive
ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else printf "-" }'; }
