# Sourced by the benchmark scripts: takes --data_plane=grpc|ucx|auto out of "$@" (into
# bench_args) and exports it as DRPC_DATA_PLANE, which every drpc worker reads (default
# auto, what users get). Prints which plane the figures are for.
bench_args=()
for bench_arg in "$@"; do
  case "$bench_arg" in
    --data_plane=grpc | --data_plane=ucx | --data_plane=auto) DRPC_DATA_PLANE=${bench_arg#--data_plane=} ;;
    --data_plane=*) echo "$(basename "$0"): --data_plane takes grpc, ucx or auto" >&2; exit 2 ;;
    *) bench_args+=("$bench_arg") ;;
  esac
done
export DRPC_DATA_PLANE=${DRPC_DATA_PLANE:-auto}
echo "data_plane=$DRPC_DATA_PLANE"
