# shellcheck shell=bash
# Sourced by the benchmark scripts: takes their shared options out of "$@" (the others stay
# in bench_args) and defines their helpers.
#   --data_plane=grpc|ucx|auto  the link between drpc's workers, exported as DRPC_DATA_PLANE,
#                               which every drpc worker reads (default auto: what users get)
#   --rounds=N                  rounds of drpc then its peer (default 3). This machine's speed
#                               drifts by up to 2x from one run to the next, for both sides; a
#                               round's ratio compares runs seconds apart, and the ratios printed
#                               last are the medians of the rounds' ratios.
bench_args=()
bench_rounds=3
for bench_arg in "$@"; do
  case "$bench_arg" in
    --data_plane=grpc | --data_plane=ucx | --data_plane=auto) DRPC_DATA_PLANE=${bench_arg#--data_plane=} ;;
    --data_plane=*) echo "$(basename "$0"): --data_plane takes grpc, ucx or auto" >&2; exit 2 ;;
    --rounds=*)
      bench_rounds=${bench_arg#--rounds=}
      if ! [[ $bench_rounds =~ ^[1-9][0-9]*$ ]]; then
        echo "$(basename "$0"): --rounds takes a positive number, got '$bench_rounds'" >&2
        exit 2
      fi
      ;;
    *) bench_args+=("$bench_arg") ;;
  esac
done
export DRPC_DATA_PLANE=${DRPC_DATA_PLANE:-auto}
echo "data_plane=$DRPC_DATA_PLANE rounds=$bench_rounds"

# field LINE KEY: the number after KEY= in LINE.
field() { echo "$1" | grep -oE "(^| )$2=[0-9.]*" | cut -d= -f2; }
# ratio A B: A / B to two decimals ("nan" when B is not positive).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
# median X...: the median of the numbers given ("nan" for none).
median() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
    END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# spread X...: "min-max" of the numbers given.
spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'; }
