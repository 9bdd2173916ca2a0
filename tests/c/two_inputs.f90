! A scripted model of two inputs (float features and int64 indices) with a loss over a target and a mask, trained from
! Fortran with fl_train_step_n, for tests/c/c_interface_test.cpp, which computes the same samples from the same
! formulas and trains them through the C++ step API.
!   two_inputs CONFIG OUT   trains 6 steps on CONFIG's learner, predicts, saves the weights to OUT
program two_inputs
  use, intrinsic :: iso_c_binding
  use fastlearn
  implicit none
  type(c_ptr) :: learn
  character(len=1024) :: config, out
  real(c_float), allocatable, target :: x(:, :), y(:, :), mask(:, :), pred(:, :)
  integer(c_int64_t), allocatable, target :: idx(:)
  real(c_double) :: loss
  integer :: s, i, j

  call get_command_argument(1, config)
  call get_command_argument(2, out)
  if (fl_create(config, learn) /= FL_OK) error stop fl_last_error()
  allocate(x(4, 5), y(1, 5), mask(1, 5), idx(5), pred(1, 5))
  x = 0
  y = 0
  mask = 1
  ! One input where the config declares two: refused by name, nothing trained.
  if (fl_train_step_n(learn, [fl_array_of(x)], [fl_array_of(y), fl_array_of(mask)], loss) /= FL_ERROR_CONFIG) &
    error stop "a wrong count of inputs was not refused"
  print '(a)', fl_last_error()
  do s = 0, 5
    do j = 1, 5
      do i = 1, 4
        x(i, j) = real(sin(0.1d0 * (s * 20 + j * 4 + i)), c_float)
      end do
      idx(j) = int(mod(s * 5 + j, 10), c_int64_t)
      y(1, j) = real(cos(0.3d0 * (s * 5 + j)), c_float)
      mask(1, j) = merge(1.0_c_float, 0.0_c_float, mod(s + j, 3) /= 0)
    end do
    if (fl_train_step_n(learn, [fl_array_of(x), fl_array_of(idx)], [fl_array_of(y), fl_array_of(mask)], loss) &
        /= FL_OK) error stop fl_last_error()
    print '(a, i0, a, es24.16)', 'step ', s, ' loss ', loss
  end do
  if (fl_predict_n(learn, [fl_array_of(x), fl_array_of(idx)], [fl_array_of(pred)]) /= FL_OK) error stop fl_last_error()
  print '(a, 5es16.8)', 'predictions ', pred(1, :)
  if (fl_save(learn, out) /= FL_OK) error stop fl_last_error()
  if (fl_free(learn) /= FL_OK) error stop fl_last_error()
end program
